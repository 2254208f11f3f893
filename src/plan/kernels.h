// Kernel costs of one transformer layer for one microbatch on one GPU, by kind (issue 30,
// item 1; docs/planner.md "Kernel costs"): each GEMM by its shape on the GPU's curve, the
// memory-bound kernels by the bytes they move at the achieved HBM bandwidth, attention by the
// GPU's fused-attention table (sequence length, head dimension) when it has one, and a floor
// per kernel for its launch. The planner's per-layer pass costs are built from these, and
// `plan --explain` stacks them.
#pragma once

#include "plan/planner.h"

namespace mt::plan {

// Our blockwise attention kernel's blocks (kernels/flash_attention.h kFlashQueryBlock and
// kFlashKeyBlock; plan/ does not include kernels/, tests/plan/context_parallel_test.cpp
// checks that they agree).
inline constexpr int64_t kOurFlashQueryBlock = 128;
inline constexpr int64_t kOurFlashKeyBlock = 256;

struct LayerKernels {
  // Forward seconds. GEMMs: qkv, attention (scores and probabilities · V over every CP key
  // block, or the fused kernel's forward), output projection, MLP in (gate + up), MLP out.
  double qkv = 0, attention = 0, proj = 0, mlp_in = 0, mlp_out = 0;
  // The attention's backward: the fused kernel's own rate, or 2 × the GEMMs.
  double attention_bwd = 0;
  // Memory-bound kernels, forward (backward moves twice the bytes): layer norms and residual
  // (dropout-)adds, the activation function, the softmax over the scores (unfused only).
  double norm_residual = 0, activation = 0, softmax = 0;
  // MoE: gathering the routed tokens in expert order and combining the experts' outputs
  // (with ep also regrouping what the all-to-alls carry), averaged over the blocks.
  double moe_copy = 0;
  double overhead = 0;  // GpuSpec::kernel_overhead_s, once per pass
  // The LM head GEMM, the f32 cross-entropy over the logits (forward and backward) and the
  // embedding lookup, on the stages that hold them (backward: 2 × the head GEMM, the
  // embedding once).
  double head = 0, cross_entropy = 0, cross_entropy_bwd = 0, embedding = 0;
  // Userbuffers chunk the GEMMs beside a TP collective (Layout::tp_comm_overlap): these are
  // the chunked times (the communication model needs them).
  double gemm_fwd() const { return qkv + attention + proj + mlp_in + mlp_out; }
  double memory_fwd() const { return norm_residual + activation + softmax + moe_copy; }
  double fwd() const { return gemm_fwd() + memory_fwd() + overhead; }
  double bwd() const {
    return 2 * (gemm_fwd() - attention) + attention_bwd + 2 * memory_fwd() + overhead;
  }
};

// `share`: the fraction of the device one rank computes on (1 on a GPU; a shared host's
// 1/N, planner.cpp's per_rank_share). An MoE model's MLP GEMMs are costed by shape: the
// router, each expert on its share of the tokens, the shared expert (plan/moe.h).
LayerKernels layer_kernels(const Job& j, const Layout& l, double share);

}  // namespace mt::plan

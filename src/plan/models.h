// Model specs of the planner: our GPT presets (model::GptConfig) and config-only presets of
// published models (Megatron-LM GPT family of Narayanan et al. 2021 Table 1, GPT-3 175B,
// Llama-3 style 8B/70B/405B with GQA and SwiGLU). FLOPs and memory only: the planner never
// builds these models.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace mt::plan {

struct ModelSpec {
  std::string name;
  int64_t n_layer = 0, n_head = 0, n_kv_head = 0, d_model = 0, d_ff = 0;
  int64_t vocab = 0;       // as the GEMMs see it (padded)
  int64_t vocab_real = 0;  // before padding (0: the same)
  int64_t seq = 0;
  bool swiglu = false;  // 3 MLP matrices (gate, up, down) instead of 2
  bool tied = true;     // LM head shares the embedding
  bool bias = true;
  // Attention and hidden dropout (GPT / Megatron recipes: masks and outputs through HBM,
  // kept for backward); Llama-style recipes train without. Our runtime has no dropout: a job
  // it runs (plan::runs_our_runtime) ignores this.
  bool dropout = true;
  bool learned_pos = true;  // position embedding table (GPT) vs rotary (Llama)

  // Mixture of experts (model::MoeConfig; docs/planner.md "Mixture of experts"): moe_layers
  // of the n_layer blocks have a router over n_experts routed experts of width d_ff_expert
  // (top_k of them per token) and a shared expert of width d_ff_shared in place of the MLP;
  // the others keep the dense MLP of d_ff. Per-block parameter counts below are averages
  // over the blocks (exact for totals; a stage's dense and MoE blocks are not told apart).
  int64_t n_experts = 0, top_k = 0, d_ff_expert = 0, d_ff_shared = 0, moe_layers = 0;
  bool is_moe() const { return n_experts > 0 && moe_layers > 0; }
  int64_t mlp_mats() const { return swiglu ? 3 : 2; }
  // One MoE block's MLP part: router + routed experts + shared expert (biases if any).
  double moe_mlp_params() const;
  // The routed experts of a block, averaged over the blocks: what expert parallelism shards.
  double block_expert_params() const;
  // The MLP a token passes through, averaged over the blocks: dense d_ff, or router + top_k
  // experts + shared; each expert's work scaled by `expert_load` (the busiest expert's
  // load over the mean). As a dense MLP width: what the GEMM and activation models take.
  double active_ff(double expert_load = 1.0) const;

  int64_t head_dim() const { return d_model / n_head; }
  int64_t kv_dim() const { return n_kv_head * head_dim(); }
  // Parameters of one block (matrices, biases, norms).
  double block_params() const;
  // Of those, the ones every TP rank holds whole: the layer norms and the row-parallel
  // linears' output biases (Megatron-LM and our runtime alike).
  double block_replicated_params() const;
  // Of an MoE block's parameters outside the routed experts, the ones every TP rank holds
  // whole, averaged over the blocks: the router (Megatron-Core's and ours), and with
  // `shared_whole` the shared expert (our runtime keeps it whole on every tp rank;
  // Megatron-Core splits it like the dense MLP).
  double block_moe_replicated_params(bool shared_whole) const;
  // One TP rank's share of a block: the split matrices and biases / t, the rest whole.
  // Routed experts: n_experts / ep of them on an ep rank, each split over `et` of its tp
  // ranks (the expert tensor-parallel size, plan/moe.h moe_expert_tp: Megatron-Core's default
  // is t; our runtime keeps them whole, 1). `ours`: as our runtime holds the rest (the shared
  // expert whole too).
  double block_params_per_tp(int t, int ep = 1, bool ours = false, int et = 1) const {
    const double whole = block_replicated_params() + block_moe_replicated_params(ours);
    return (block_params() - block_expert_params() - whole) / t + whole +
           block_expert_params() / (double(ep) * et);
  }
  // One TP rank's embedding (token, + position) and head (final norm, + LM head when
  // untied): the vocabulary split (vocab-parallel), the position table and norm whole.
  double embedding_params_per_tp(int t) const;
  double head_params_per_tp(int t) const;
  double embedding_params() const { return embedding_params_per_tp(1); }
  double head_params() const { return head_params_per_tp(1); }
  double total_params() const;
  // Parameters a token's forward touches (the embedding row, blocks with router + top_k
  // experts + shared, the head): the "active" count MoE papers quote.
  double active_params() const;
  // GEMM weights touched per token (blocks + LM head), the P_matmul of docs/flops.md; for a
  // MoE model the active ones (router + top_k experts + shared).
  double matmul_params() const;
};

ModelSpec from_gpt(const model::GptConfig& c);
// Our presets (model::preset_names()) and the published ones; `seq` 0 keeps the preset's.
ModelSpec model_preset(const std::string& name);
std::vector<std::string> model_preset_names();

// Model FLOPs per token (no recomputation; docs/flops.md, the same formula as
// model::training_flops_per_token): 6·P_matmul + 12·L·C·T (full T×T attention).
double model_flops_per_token(const ModelSpec& m, int64_t seq);
enum class Recompute : uint8_t { kNone, kSelective, kFull };
// Hardware FLOPs per token: recomputed forwards included (Narayanan et al. eq. 3 with full
// recomputation: blocks 8·, attention 16·L·C·T, LM head 6·).
double hw_flops_per_token(const ModelSpec& m, int64_t seq, Recompute r);

}  // namespace mt::plan

// The layers of a transformer block, each an explicit forward/backward pair (llm.c style).
// One block for every architecture: its norm, attention (with its position encoding) and
// MLP are chosen by the config (model/config.h), never a copy of the block per model.
// Forward writes what backward needs into the caller's activation buffers; backward
// accumulates parameter gradients into the Param's gradient view.
#pragma once

#include <cstddef>
#include <cstdint>

#include "model/moe.h"
#include "model/params.h"
#include "model/rope.h"
#include "parallel/context.h"
#include "parallel/tp.h"

namespace mt::model {

// LayerNorm (GPT-2: mean and variance, weight and bias) or RMSNorm (Llama: root mean
// square, weight only, eps from the config). `mean` is LayerNorm's alone.
struct Norm {
  Param* w = nullptr;
  Param* b = nullptr;  // null without bias (always with RMSNorm)
  int64_t c = 0;
  bool rms = false;
  float eps = 1e-5f;  // RMSNorm's
  void forward(float* y, float* mean, float* rstd, const float* x, int64_t n) const;
  // y f32, or bf16 (rounded once: an output that only feeds GEMMs).
  void forward(const Tensor& y, float* mean, float* rstd, const float* x, int64_t n) const;
  // dx += d(loss)/dx
  void backward(float* dx, const float* dy, const float* x, const float* mean, const float* rstd,
                int64_t n) const;
};

// --dtype bf16 (docs/mixed_precision.md): a rank's bf16 workspaces, allocated with the
// model's scratch (before step 1, mem::Category::kWorkspace). Null (f32 training): none.
struct MixedPrecision {
  Tensor x;   // bf16 [largest GEMM input]: the activation input rounded on the fly
  Tensor dy;  // bf16: the output gradient rounded (the LM head's in row chunks)
  // bf16 [N, 4·C/t]: q, k, v (kv heads repeated) and the attention output's gradient rounded
  // for the CPU's T × T attention kernel (attention_forward_mixed); undefined where attention
  // runs another kernel (blockwise, context parallel, a GPU's), which stays f32 here.
  Tensor attn;
};

// The activation input x of a weight GEMM: f32, or already bf16 (with --dtype bf16 the
// activations that only feed GEMMs, the layer-norm and GELU/SwiGLU outputs, are stored
// rounded: docs/mixed_precision.md), or none (an input-gradient-only backward).
struct GemmIn {
  const float* f = nullptr;
  const bf16* h = nullptr;
  GemmIn(std::nullptr_t) {}           // NOLINT: none
  GemmIn(const float* p) : f(p) {}    // NOLINT: an f32 activation is an input
  GemmIn(const bf16* p) : h(p) {}     // NOLINT: so is a bf16 one
  static GemmIn of(const Tensor& t);  // by the tensor's dtype
  bool defined() const { return f || h; }
};

// The one dispatch point of every weight GEMM (the blocks' linears and the LM head):
// y = x·wᵀ (+ b) (+ residual: the blocks' skip connections, added in the bf16 GEMM's epilogue
// on the CPU) and its backward (dx overwritten, dw += and db +=, each skipped when
// null; x is only read for dw). mp null: the f32 kernels (x must be f32). Else an f32 x
// and dy are rounded to bf16 into mp's workspaces (a bf16 x is read as it is), w's bf16
// copy (Param::value_bf16) is read, and the products are accumulated in f32
// (kernels/mixed.h); y, dx, dw, db stay f32.
void gemm_forward(const MixedPrecision* mp, float* y, GemmIn x, const Param& w, const float* b,
                  int64_t n, int64_t in, int64_t out, const float* residual = nullptr);
void gemm_backward(const MixedPrecision* mp, float* dx, float* dw, float* db, const float* dy,
                   GemmIn x, const Param& w, int64_t n, int64_t in, int64_t out);
// The forward with y rounded once to bf16 from its f32 result (an output only GEMMs read:
// qkv under the T × T attention on bf16 operands); mp must be set.
void gemm_forward(const MixedPrecision* mp, bf16* y, GemmIn x, const Param& w, const float* b,
                  int64_t n, int64_t in, int64_t out);
// The LM head's backward from an output gradient already in bf16 (dy [n, out], row stride
// ldy: kernels::ce_backward_bf16_in_place), dx and dw as above; mp must be set. Its dx sums
// the same column chunks as the f32 dy's.
void gemm_backward(const MixedPrecision* mp, float* dx, float* dw, const bf16* dy, int64_t ldy,
                   GemmIn x, const Param& w, int64_t n, int64_t in, int64_t out);
// The same on a weight given by pointers (one expert's slice of a stacked weight): w its f32
// values, wb its bf16 copy (read when mp is set).
void gemm_forward(const MixedPrecision* mp, float* y, GemmIn x, const float* w, const bf16* wb,
                  const float* b, int64_t n, int64_t in, int64_t out,
                  const float* residual = nullptr);
void gemm_backward(const MixedPrecision* mp, float* dx, float* dw, float* db, const float* dy,
                   GemmIn x, const float* w, const bf16* wb, int64_t n, int64_t in, int64_t out);

struct Linear {
  Param* w = nullptr;  // [out, in]
  Param* b = nullptr;  // [out] or null
  int64_t in = 0, out = 0;
  const MixedPrecision* mp = nullptr;  // bf16 GEMMs (the model's), null: f32
  // y = x·wᵀ + b (+ residual, another buffer: in the bf16 GEMM's epilogue on the CPU, else a
  // pass of its own; the same bits either way)
  void forward(float* y, GemmIn x, int64_t n, const float* residual = nullptr) const;
  // y (f32, or bf16 for an output only GEMMs read: rounded once from the f32 result)
  void forward(const Tensor& y, GemmIn x, int64_t n) const;
  // dx overwritten (skipped when null)
  void backward(float* dx, const float* dy, GemmIn x, int64_t n) const;
};

// Activations of one block for one microbatch: exactly what its backward reads. With
// --dtype bf16 the ones that only feed GEMMs are stored in bf16 (ln1; ln2 in a model
// without MoE layers, whose router reads it in f32; fch_gelu): each is rounded once, where
// it is written, instead of each time a GEMM reads it, and takes half the memory. The
// GEMMs read the same bits either way.
struct BlockActivations {
  Tensor ln1, ln1_mean, ln1_rstd;  // [N, C], [N], [N]
  Tensor qkv;                      // [N, qkv_dim] q | k | v (rotated, with RoPE; bf16: below)
  Tensor att;                      // [B, NH, T, T] softmax probabilities (flash: [B, NH, T] lse)
  Tensor atty;                     // [N, C] attention output before c_proj (bf16: see below)
  Tensor res2;                     // [N, C] x + attention branch
  Tensor ln2, ln2_mean, ln2_rstd;  // [N, C], [N], [N]
  Tensor fch;                      // [N, F] before GELU ([N, 2F] gate | up with SwiGLU)
  Tensor fch_gelu;                 // [N, F] the activation's output
  Tensor out;                      // [N, C] block output (= next block's input)
  MoeActivations moe;              // an MoE block's (model/moe.h); fch, fch_gelu unused then
  // d(loss)/d(the MoE layer's balancing losses): set by the model before backward.
  float moe_loss_weight = 0;
};

// Zero-bubble split backward: the output gradients of the four linear layers, kept from the
// input-gradient pass (B) for the weight-gradient pass (W) of the same microbatch. Row
// counts are the full N (with --sp the gathered gradients).
struct BlockGradStash {
  Tensor dqkv;   // [N, qkv_dim/t]
  Tensor dproj;  // [N, C] d(attention c_proj output)
  Tensor dfch;   // [N, fc_dim/t]
  Tensor dmlp;   // [N, C] d(mlp c_proj output)
};

// Backward scratch shared by all blocks (one set per rank).
struct BlockScratch {
  Tensor dln;    // [N, C]
  Tensor datty;  // [N, C]
  Tensor dqkv;   // [N, qkv_dim]
  Tensor dfch;   // [N, fc_dim]
  Tensor dgelu;  // [N, F]
  Tensor datt;   // [B, NH, T, T] (flash: unused)
  // Grouped-query attention: the q | k | v rows with the kv heads repeated per query head,
  // and their gradient ([N, 3C] each; undefined with multi-head attention).
  Tensor qkvx;
  Tensor dqkvx;
  // Tensor parallelism with --sp: the gathered input of a column-parallel layer (and the
  // gathered output gradient of a row-parallel one), and the partial sums before a
  // reduce-scatter. [N, C] each; undefined otherwise.
  Tensor gath;
  Tensor part;
  // Context parallelism: the attention's exchange buffers (parallel/context.h Workspace);
  // undefined otherwise.
  Tensor cp_local, cp_ranked, cp_kv, cp_dkv, cp_o, cp_lse;
  MoeScratch moe;  // with MoE layers
};

// With tensor parallelism (tp.size = t > 1) the block is Megatron's: c_attn and c_fc are
// column-parallel (this rank's n_head/t heads, d_ff/t hidden units), attn_proj and
// mlp_proj row-parallel (their biases added once, after the reduction), and the only
// communication is f before each column-parallel layer and g after each row-parallel one
// (parallel/tp.h). With --sp the layer norms and the residual run on this rank's N/t rows.
// The Linear members then hold the local shapes (c_attn: in C, out 3C/t; ...).
struct Block {
  Norm ln_1, ln_2;
  Linear c_attn, attn_proj, c_fc, mlp_proj;
  int64_t n_head = 0;     // global query heads
  int64_t n_kv_head = 0;  // global key/value heads (= n_head: multi-head attention)
  MlpKind mlp = MlpKind::kGelu;
  // An MoE block: the mixture of experts in the MLP's place (c_fc and mlp_proj unset). Its
  // experts are whole on every tp rank (expert tensor parallelism 1) and run on all N
  // tokens of the microbatch (with --sp gathered), so that routing and capacity see the
  // same tokens on every layout.
  bool is_moe = false;
  MoeLayer moe;
  int layer = -1;                    // the global block index
  const RopeTables* rope = nullptr;  // rotary positions on q and k; null: none (GPT-2)
  parallel::tp::TpContext tp;
  // Context parallelism: the sequence split over the cp group (parallel/context.h); the
  // block then runs on the local rows (T below is the local sequence) and its attention
  // exchanges keys and values over cp. Null: the whole sequence.
  const parallel::cp::CpContext* cp = nullptr;

  // What a block keeps for backward (activation recomputation, Korthikanti et al. 2022):
  // everything; everything but the attention probabilities (selective: recomputed from qkv
  // in backward); or only its output, the next block's input (full: the block's forward
  // runs again in backward). Tensors not kept are left undefined here; the model points
  // them at one shared set.
  enum class Keep : uint8_t { kAll, kNoAttention, kOutputOnly };
  // bf16_inputs: --dtype bf16 (the GEMM-only activations in bf16); bf16_attention: and the
  // attention runs the CPU's T × T kernel on bf16 operands (attention_forward_mixed), so that
  // atty, read only by c_proj's GEMMs, is bf16 too, and so is qkv, read only by the
  // attention's GEMMs, where nothing works on it in f32 first (no RoPE, every head its own
  // keys and values).
  // Whether a model's blocks can keep qkv in bf16 under bf16_attention: nothing works on it in
  // f32 first (no RoPE, every query head its own keys and values).
  static bool qkv_fits_bf16(const GptConfig& c) {
    return !c.llama_family() && c.kv_heads() == c.n_head;
  }
  static BlockActivations make_activations(const GptConfig& c, int64_t B, int64_t T,
                                           const parallel::tp::TpContext& tp = {},
                                           Keep keep = Keep::kAll, int ep = 1,
                                           bool bf16_inputs = false, bool bf16_attention = false);
  // A model with MoE layers gives every block's activations the MoE buffers, and the dense
  // MLP's only when it has dense blocks too (a pipeline slot serves any chunk).
  // Selective recomputation: the attention probabilities again, from the kept qkv.
  void recompute_attention(BlockActivations& a, int64_t B, int64_t T, BlockScratch& s) const;
  // T: the local sequence (T / cp with context parallelism).
  static BlockScratch make_scratch(const GptConfig& c, int64_t B, int64_t T,
                                   const parallel::tp::TpContext& tp = {},
                                   const parallel::cp::CpContext& cp = {}, int ep = 1);

  // x: [N, C] (with --sp this rank's [N/t, C] rows). `s` is needed with tensor parallelism.
  void forward(BlockActivations& a, const float* x, int64_t B, int64_t T,
               BlockScratch* s = nullptr) const;
  // dres holds d(loss)/d(block output) on entry and d(loss)/d(block input) on exit.
  void backward(float* dres, BlockScratch& s, const BlockActivations& a, const float* x, int64_t B,
                int64_t T) const;
  // The same backward in two passes (zero-bubble pipelines): backward_input computes
  // d(block input) and the layer norms' weight gradients, stashing what the four linear
  // layers' weight gradients need; backward_weight adds those later. Together they give
  // the same gradients as backward.
  static BlockGradStash make_stash(const GptConfig& c, int64_t B, int64_t T,
                                   const parallel::tp::TpContext& tp = {});
  void backward_input(float* dres, BlockScratch& s, const BlockActivations& a, const float* x,
                      BlockGradStash& st, int64_t B, int64_t T) const;
  void backward_weight(BlockScratch& s, const BlockActivations& a, const BlockGradStash& st,
                       int64_t B, int64_t T) const;

 private:
  // The parts between the linears: RoPE on the fresh q and k; attention (through the
  // repeated kv heads with grouped-query attention) and its backward into dqkv; the MLP's
  // activation (GELU, or SwiGLU's gate) and its backward into dfch.
  void rotate_qkv(float* qkv, int64_t B, int64_t T, bool backward) const;
  void attend(BlockActivations& a, int64_t B, int64_t T, BlockScratch& s,
              const char* scope = "attention.fwd") const;
  void attend_backward(float* dqkv, BlockScratch& s, const BlockActivations& a, int64_t B,
                       int64_t T) const;
  // x (elems floats) rounded into mp->attn at element `at` (a counted bf16.convert), where
  // attention runs the CPU's T × T kernel on bf16 operands; else null (the f32 kernels).
  const bf16* rounded_for_attention(const float* x, int64_t elems, int64_t at = 0) const;
  bool context_parallel() const { return cp && cp->active(); }
  parallel::cp::AttentionShape cp_shape(int64_t B, int64_t T) const;
  void activation_forward(BlockActivations& a) const;
  void activation_backward(float* dfch, const float* dy, const BlockActivations& a) const;
  // The MoE branch with tensor parallelism: out = res2 + moe(in2) on this rank's rows, and
  // its backward into dres (d(ln_2 output) through s.dln).
  void moe_forward_tp(BlockActivations& a, const float* in2, int64_t N, BlockScratch& s) const;
  void moe_backward(float* dres, BlockScratch& s, const BlockActivations& a, int64_t N) const;
  void forward_tp(BlockActivations& a, const float* x, int64_t B, int64_t T, BlockScratch& s) const;
  void backward_tp(float* dres, BlockScratch& s, const BlockActivations& a, const float* x,
                   int64_t B, int64_t T) const;
  // Row-parallel layer + g + bias + residual: y = residual + reduce(x·wᵀ) + b.
  void row_parallel_forward(const Linear& l, float* y, GemmIn x, const float* residual, int64_t N,
                            BlockScratch& s) const;
  // A layer-norm output as the column-parallel GEMM's input: with --sp this rank's rows
  // all-gathered into s.gath (in the tensor's dtype), else the tensor itself.
  GemmIn all_rows(const Tensor& ln_out, BlockScratch& s) const;
};

}  // namespace mt::model

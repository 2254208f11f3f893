// Mixed-precision (bf16) kernels, for training with:
//   - fp32 master parameters in the optimizer and a bf16 working copy that GEMMs read
//     (adamw_update_mixed writes both);
//   - bf16 activations where they only feed a GEMM (layer-norm output, attention output,
//     GELU output): the `x` of linear_forward_mixed / linear_backward_mixed;
//   - GEMMs on bf16 operands with fp32 accumulation (oneDNN matmul, AMX on this host);
//   - fp32 everywhere else: outputs y, input gradients dx, weight and bias gradients
//     (accumulated in fp32: dw += ... adds an fp32 product to an fp32 dw), and the math of
//     layer norm, softmax, cross-entropy and GELU (kernels.h, unchanged).
// Same conventions as kernels.h: forward outputs and dx overwritten, dw and db accumulated.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace mt::kernels {

// ---- conversions ------------------------------------------------------------------------
// y[i] = x[i] rounded to bf16, to nearest with ties to even (the same bits as
// f32_to_bf16 in core/dtype.h, subnormals included: no flush to zero). inf stays inf, a
// NaN stays a NaN of the same sign (made quiet); a finite value above the largest bf16
// (by at least half an ulp) becomes inf, as IEEE rounding says.
void to_bf16(bf16* y, const float* x, int64_t n);
// y[i] = x[i] exactly (every bf16 is an f32).
void to_f32(float* y, const bf16* x, int64_t n);

// ---- linear, bf16 operands: y[n,out] = x[n,in] * w[out,in]^T + b[out] --------------------
// The product is accumulated in f32; b (f32) may be null and is added in f32.
void linear_forward_mixed(float* y, const bf16* x, const bf16* w, const float* b, int64_t n,
                          int64_t in, int64_t out);
// The same, with the f32 result (bias included) rounded once to bf16: for an output that
// only feeds another GEMM.
void linear_forward_mixed(bf16* y, const bf16* x, const bf16* w, const float* b, int64_t n,
                          int64_t in, int64_t out);
// The f32 one plus a residual: y = x·wᵀ + b + r, r [n, out] f32 (another buffer than y), added
// in the GEMM's epilogue (oneDNN's binary post-op, after the bias) instead of a pass of its
// own over y: the same bits as linear_forward_mixed followed by add(y, y, r). The CPU only.
void linear_forward_mixed_residual(float* y, const bf16* x, const bf16* w, const float* b,
                                   const float* r, int64_t n, int64_t in, int64_t out);

// Backward with dy in f32. The GEMMs need dy in bf16, so dy is rounded into `ws`, a
// workspace of ws_elems bf16 owned by the caller (allocated once, before step 1, under
// mem::Category::kWorkspace: this function allocates nothing). With
// ws_elems >= n*out it runs as one pass. A smaller workspace makes it work through chunks:
// of ws_elems/n columns when n <= out and it holds one column (the LM head, whose dy is
// [n, vocab]: each chunk writes its own rows of dw once, and dx adds the chunks up in f32),
// else of ws_elems/out rows (it must hold one row; each chunk adds to the whole dw). Chunks
// change only the order in which dx or dw add up; db's sums are the same.
//   dx[n,in]   = dy * w          (f32, overwritten; skipped when dx is null)
//   dw[out,in] += dy^T * x       (f32 += f32 product; skipped when dw is null)
//   db[out]    += sum_rows(dy)   (summed from the f32 dy, rows in order; db may be null)
// dx and dw see dy rounded to bf16 (relative error <= 2^-8 per element); db does not.
void linear_backward_mixed(float* dx, float* dw, float* db, const float* dy, const bf16* x,
                           const bf16* w, int64_t n, int64_t in, int64_t out, bf16* ws,
                           int64_t ws_elems);
// The same from an output gradient already in bf16 (dy [n, out], row stride ldy), for the
// LM head (ce_backward_bf16_in_place writes it): nothing to round, no workspace, no bias.
// dx sums dy's columns in chunks of chunk_cols (the f32 dy's column chunks), each chunk
// writing its own rows of dw. Not bitwise the f32 dy's results: oneDNN blocks a GEMM by its
// operands' leading dimensions, and this dy's is 2·out (measured: the last bits differ;
// deterministic for a given shape). The CPU only.
void linear_backward_mixed(float* dx, float* dw, const bf16* dy, int64_t ldy, const bf16* x,
                           const bf16* w, int64_t n, int64_t in, int64_t out, int64_t chunk_cols);
// The columns a chunk of linear_backward_mixed's f32 dy takes with a workspace of ws_elems
// (out: one pass), where it works by columns (n <= out).
constexpr int64_t linear_backward_mixed_chunk_cols(int64_t n, int64_t out, int64_t ws_elems) {
  return ws_elems >= n * out ? out : (n > 0 && ws_elems >= n ? ws_elems / n : 1);
}

// ---- the LM head's output gradient in bf16 ----------------------------------------------
// Cross-entropy's backward over a vocabulary slice (kernels.h cross_entropy_backward, and
// vocab_parallel.h's vocab_parallel_ce_backward with v0 and real), rounded to bf16 and written
// over the logits it is computed from: row i's bf16 values take the first half of row i's
// f32 bytes, so the result is the [n, cols] bf16 matrix at reinterpret_cast<bf16*>(logits)
// with row stride 2·cols. Each value is to_bf16 of the f32 kernel's. Under --dtype bf16 the
// LM head's backward GEMMs read nothing else: this drops the f32 gradient's write and the
// two roundings of it (dx, then the deferred d(wte)). A target outside [v0, v0 + real) is
// another rank's (vocabulary parallelism); the columns from `real` on are padding (0). The
// CPU only.
void ce_backward_bf16_in_place(float* logits, const float* lse, const int32_t* targets, float dloss,
                               int64_t n, int64_t cols, int64_t real, int64_t v0);

// The workspace that runs linear_backward_mixed in one pass.
constexpr int64_t linear_backward_mixed_ws_elems(int64_t n, int64_t out) { return n * out; }

// ---- causal attention with bf16 GEMM operands (the CPU's T x T kernel) --------------------
// attention_forward (kernels.h) with its four GEMMs on bf16 operands and f32 accumulation:
// qkv is the [B, T, 3C] activation rounded to bf16 (by the caller, one counted pass); the
// scores come out f32, the softmax runs on them in f32 and `att` keeps its probabilities in
// f32 for the backward, as the f32 kernel's; P·V reads them rounded (in the softmax's own
// pass). So out differs from attention_forward on the same rounded q, k, v by the rounding
// of P alone: at most 2^-8 Σ_j p_j |v_j| per element, plus f32 summation order.
void attention_forward_mixed(float* out, float* att, const bf16* qkv, int64_t B, int64_t T,
                             int64_t C, int64_t NH);
// The same with out rounded to bf16 (to_bf16's bits of the f32 out), for an output that
// only feeds a GEMM (attention's c_proj).
void attention_forward_mixed(bf16* out, float* att, const bf16* qkv, int64_t B, int64_t T,
                             int64_t C, int64_t NH);
// Its backward: dout [B, T, C] and qkv in bf16, att the forward's probabilities; dqkv
// overwritten (f32), scratch as attention_backward's (dS, f32). dP = dO·Vᵀ on the rounded
// operands, the softmax backward in f32, then dQ = dS·K, dK = dSᵀ·Q and dV = Pᵀ·dO with dS
// and P rounded to bf16. The CPU only (a GPU runs its own kernels in bf16).
void attention_backward_mixed(float* dqkv, float* scratch, const bf16* dout, const bf16* qkv,
                              const float* att, int64_t B, int64_t T, int64_t C, int64_t NH);

// ---- AdamW on fp32 master weights --------------------------------------------------------
// Exactly adamw_update on `master` (the same bits for master, m and v), then
// param_out[i] = to_bf16(master[i]) (the working copy the GEMMs read).
void adamw_update_mixed(float* master, bf16* param_out, const float* grad, float* m, float* v,
                        int64_t n, float lr, float beta1, float beta2, float eps,
                        float weight_decay, int64_t t);

}  // namespace mt::kernels

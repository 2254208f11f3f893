// The math of one rank: a CPU implementation (kernels/*.cpp) and a CUDA one
// (kernels/cuda/), chosen by the calling thread's device (core/device.h): each CPU kernel
// starts with MT_CUDA_DISPATCH, which hands the call to kernels::cuda when the thread
// computes on a GPU (all pointers are then device pointers).
// Layout follows llm.c: activations are row-major [rows, features], rows = B*T.
// Weights of a linear layer are [out, in] (PyTorch nn.Linear), so a column-parallel
// shard (a slice of outputs) is a contiguous block of rows.
//
// Conventions: forward outputs are overwritten. In backward, weight and bias gradients
// are ACCUMULATED (+=) so that microbatches add up; an input gradient is overwritten
// unless the function says it accumulates.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace mt::kernels {

// Intra-op threads of the calling thread (each rank thread sets its own), within
// OMP_THREAD_LIMIT.
void set_threads(int n);
// Brings the calling task's team size within OMP_THREAD_LIMIT (oneDNN computes wrong GEMMs
// beyond it); every oneDNN call goes through it.
void respect_thread_limit();
int threads();
// Cores on this host, as the OS reports them.
int host_cores();

// ---- GEMM -------------------------------------------------------------------------
// C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C, row-major with leading dims.
// op(A) = A if !trans_a (A is [M, lda>=K]) else A^T (A is [K, lda>=M]); same for B.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
// bf16 inputs, f32 accumulation and output.
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const bf16* A, int64_t lda, const bf16* B, int64_t ldb, float beta, float* C,
               int64_t ldc);
// `batch` independent GEMMs; matrix i of A starts at A + i*stride_a (likewise B, C).
void gemm_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const float* A, int64_t lda, int64_t stride_a, const float* B, int64_t ldb,
                  int64_t stride_b, float beta, float* C, int64_t ldc, int64_t stride_c,
                  int64_t batch);

// ---- linear: y[n,out] = x[n,in] * w[out,in]^T + b[out] (b may be null) -------------
void linear_forward(float* y, const float* x, const float* w, const float* b, int64_t n, int64_t in,
                    int64_t out);
// dx = dy * w (overwritten; skipped when dx is null); dw += dy^T * x; db += sum_rows(dy)
// (db may be null).
void linear_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                     const float* w, int64_t n, int64_t in, int64_t out);

// ---- layer norm over the last dim (eps 1e-5); mean and rstd [n] stashed for backward --
// b and db may be null (a model without biases).
void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int64_t n, int64_t c);
// The same with y rounded to bf16 (--dtype bf16 keeps an output that only feeds GEMMs so,
// docs/mixed_precision.md): bitwise to_bf16 (mixed.h) of the f32 overload's y; likewise the
// bf16 overloads of rmsnorm_forward, swiglu_forward and gelu_forward below.
void layernorm_forward(bf16* y, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int64_t n, int64_t c);
// dx += ...; dw += ...; db += ...
void layernorm_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                        const float* w, const float* mean, const float* rstd, int64_t n, int64_t c);

// ---- the Llama family's parts (CUDA twins: kernels/cuda/llama.cu) ---------------------
// RMSNorm: y = x / sqrt(mean(x²) + eps) · w per row; rstd[i] stashed for backward.
void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t n, int64_t c,
                     float eps);
void rmsnorm_forward(bf16* y, float* rstd, const float* x, const float* w, int64_t n, int64_t c,
                     float eps);
// dx += ...; dw += ...
void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                      const float* rstd, int64_t n, int64_t c);
// Rotary embeddings in place on `heads` heads of hd dims starting at column col0 of each of
// the B·T rows (row_stride floats apart; row b·T + t is position t), rotate-half convention;
// cos, sin: [T, hd/2]. Backward applies the inverse rotation to the gradient in place.
void rope_forward(float* x, int64_t B, int64_t T, int64_t row_stride, int64_t col0, int64_t heads,
                  int64_t hd, const float* cos, const float* sin);
void rope_backward(float* dx, int64_t B, int64_t T, int64_t row_stride, int64_t col0, int64_t heads,
                   int64_t hd, const float* cos, const float* sin);
// SwiGLU: h [n, 2f] rows of gate | up; y [n, f] = silu(gate)·up; dh overwritten.
void swiglu_forward(float* y, const float* h, int64_t n, int64_t f);
void swiglu_forward(bf16* y, const float* h, int64_t n, int64_t f);
void swiglu_backward(float* dh, const float* h, const float* dy, int64_t n, int64_t f);
// Grouped-query attention: qkv rows [q (heads·hd) | k (kv_heads·hd) | v (kv_heads·hd)] to the
// multi-head kernel's [q | k | v] of heads·hd each (kv head k repeated for query heads
// k·g .. k·g+g−1), and the gradients back (each group's k and v gradients summed in order).
void expand_kv_heads(float* full, const float* qkv, int64_t n, int64_t heads, int64_t kv_heads,
                     int64_t hd);
void reduce_kv_heads(float* dqkv, const float* dfull, int64_t n, int64_t heads, int64_t kv_heads,
                     int64_t hd);

// ---- GELU, tanh approximation (GPT-2) -------------------------------------------------
void gelu_forward(float* y, const float* x, int64_t n);
void gelu_forward(bf16* y, const float* x, int64_t n);
void gelu_backward(float* dx, const float* x, const float* dy, int64_t n);  // dx overwritten

// ---- causal multi-head self-attention -----------------------------------------------
// qkv [B, T, 3*C]: q | k | v, head h at columns h*hd .. (h+1)*hd of each, C = NH*hd.
// out [B, T, C]; att [B, NH, T, T] keeps the softmax probabilities for backward
// (entries above the diagonal are written as 0).
void attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t NH);
// dqkv overwritten. scratch: at least attention_scratch_elems floats.
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int64_t B, int64_t T, int64_t C, int64_t NH);
// The floats of `att` (kept from forward to backward) and of backward's scratch on the
// current device: B*NH*T*T each on the CPU (the probabilities); the flash-style kernels keep
// B*NH*T (the rows' log-sum-exp).
int64_t attention_stash_elems(int64_t B, int64_t NH, int64_t T);
int64_t attention_scratch_elems(int64_t B, int64_t NH, int64_t T);
// One query position against a key/value cache (generation, model/decode.h; the CPU only):
// q [heads·hd] of the newest position, k and v [len, kv_heads·hd] of positions 0..len-1
// (the newest included), query head h reading kv head h / (heads / kv_heads) as
// expand_kv_heads repeats them. out [heads·hd] = softmax(q·kᵀ / sqrt(hd)) v per head;
// scores: at least heads·len floats of scratch.
void attention_decode(float* out, float* scores, const float* q, const float* k, const float* v,
                      int64_t len, int64_t heads, int64_t kv_heads, int64_t hd);
// The flash-style attention of the calling thread's device, on or off for that thread, off
// until set (the trainer sets it on each rank thread: --attention flash, or auto where it is
// at least as fast). On a GPU: the fused kernel (flash-attention-2 style on bf16 tensor
// cores). On the CPU: the blockwise f32 kernel of flash_attention.h, which attention_forward
// then runs (att = the log-sum-exp); its backward reads the forward's output, so callers run
// flash_attention_backward instead of attention_backward (which refuses while it is on).
// `fused_attention_unsupported` is "" when this build can run a head dim and sequence length
// fused on a GPU, else the reason.
void set_fused_attention(bool on);
bool fused_attention();
std::string fused_attention_unsupported(int64_t head_dim, int64_t T);

// ---- fused softmax + cross-entropy over a (possibly padded) vocabulary ---------------
// logits [n, Vp]; only the first V columns are real (the padding never changes the loss).
// losses[i] = logsumexp(logits[i, :V]) - logits[i, target[i]]; lse[i] stashed.
void cross_entropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets,
                           int64_t n, int64_t V, int64_t Vp);
// dlogits[i, j] = (softmax_j - [j == target_i]) * dloss for j < V, 0 for padding columns.
// dlogits may alias logits (computed in place).
void cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                            const int32_t* targets, float dloss, int64_t n, int64_t V, int64_t Vp);

// ---- embeddings: y[b,t,:] = wte[tokens[b,t], :] + wpe[t, :] (wpe null: no positions; the
// CPU only) -----------------------------------------------------------------------------
void embedding_forward(float* y, const int32_t* tokens, const float* wte, const float* wpe,
                       int64_t B, int64_t T, int64_t C);
// dwte += ..., dwpe += ... (dwpe may be null)
void embedding_backward(float* dwte, float* dwpe, const float* dy, const int32_t* tokens, int64_t B,
                        int64_t T, int64_t C);

// ---- elementwise ----------------------------------------------------------------------
void add(float* y, const float* a, const float* b, int64_t n);  // y = a + b (y may alias)
void accumulate(float* y, const float* x, int64_t n);           // y += x
void scale(float* y, float s, int64_t n);                       // y *= s
void copy(float* y, const float* x, int64_t n);                 // y = x (no overlap)
double sum_squares(const float* x, int64_t n);                  // in double, fixed order
double sum(const float* x, int64_t n);                          // in double, fixed order
// y[0..n) = +0 on the calling rank's threads, in host memory. A memset runs on one core:
// zeroing Model M's gradients took 12 ms of a 2-thread step on 1 and on 2 threads.
void zero(float* y, int64_t n);

// ---- AdamW (decoupled weight decay), one step t >= 1, with bias correction ------------
void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t t);
// Many parameters in one call (on a GPU one launch): segment k updates elements
// [offset, offset + n) of the four arrays with its own weight decay. The same bits as
// adamw_update on each segment.
struct AdamwSegment {
  int64_t offset = 0;
  int64_t n = 0;
  float weight_decay = 0.f;
  // The segment's bf16 working copy (element 0 of the segment), written in the same pass as
  // bf16(param) — adamw_update_mixed's rounding — or none.
  bf16* bf16_out = nullptr;
};
// grad_scale multiplies every gradient as it is read (global-norm clipping folded into the
// update: the same bits as scaling the gradients first, without their read and write).
void adamw_update_multi(float* param, const float* grad, float* m, float* v,
                        const AdamwSegment* segs, int64_t n_segs, float lr, float beta1,
                        float beta2, float eps, int64_t t, float grad_scale = 1.0f);

}  // namespace mt::kernels

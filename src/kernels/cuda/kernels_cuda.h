// The CUDA implementation of kernels.h, vocab_parallel.h and mixed.h: the same functions
// with the same arguments, meaning and conventions (forward outputs and input gradients
// overwritten, weight/bias gradients accumulated), on device pointers. Every kernel runs on
// the calling thread's stream (device::cuda_stream()) and returns without waiting, except
// where it returns a value to the host (sum_squares, sum), which waits for its result.
//
// The public functions of kernels.h dispatch here when device::on_cuda() (one line at the
// top of each CPU kernel). Deterministic: the same inputs give bitwise the same outputs,
// run after run (no float atomics whose order varies; reductions in a fixed tree).
// Allocation: a kernel may keep a per-thread workspace (cuBLASLt's, a reduction's), grown
// on first use and then reused, so that a training step allocates nothing after step 1.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/kernels.h"

namespace mt::kernels::cuda {

// ---- GEMM (cuBLASLt). f32: CUBLAS_COMPUTE_32F (true f32, no TF32: the CPU oracle's
// precision); bf16 operands: f32 accumulation and output.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const bf16* A, int64_t lda, const bf16* B, int64_t ldb, float beta, float* C,
               int64_t ldc);
void gemm_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const float* A, int64_t lda, int64_t stride_a, const float* B, int64_t ldb,
                  int64_t stride_b, float beta, float* C, int64_t ldc, int64_t stride_c,
                  int64_t batch);

void linear_forward(float* y, const float* x, const float* w, const float* b, int64_t n, int64_t in,
                    int64_t out);
void linear_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                     const float* w, int64_t n, int64_t in, int64_t out);

void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int64_t n, int64_t c);
// y rounded to bf16 (the bits of to_bf16 of the f32 y); likewise the other bf16 overloads.
void layernorm_forward(bf16* y, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int64_t n, int64_t c);
void layernorm_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                        const float* w, const float* mean, const float* rstd, int64_t n, int64_t c);

// The Llama-family parts (llama.cu).
void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t n, int64_t c,
                     float eps);
void rmsnorm_forward(bf16* y, float* rstd, const float* x, const float* w, int64_t n, int64_t c,
                     float eps);
void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                      const float* rstd, int64_t n, int64_t c);
void rope_forward(float* x, int64_t B, int64_t T, int64_t row_stride, int64_t col0, int64_t heads,
                  int64_t hd, const float* cos, const float* sin);
void rope_backward(float* dx, int64_t B, int64_t T, int64_t row_stride, int64_t col0, int64_t heads,
                   int64_t hd, const float* cos, const float* sin);
void swiglu_forward(float* y, const float* h, int64_t n, int64_t f);
void swiglu_forward(bf16* y, const float* h, int64_t n, int64_t f);
void swiglu_backward(float* dh, const float* h, const float* dy, int64_t n, int64_t f);
void expand_kv_heads(float* full, const float* qkv, int64_t n, int64_t heads, int64_t kv_heads,
                     int64_t hd);
void reduce_kv_heads(float* dqkv, const float* dfull, int64_t n, int64_t heads, int64_t kv_heads,
                     int64_t hd);

void gelu_forward(float* y, const float* x, int64_t n);
void gelu_forward(bf16* y, const float* x, int64_t n);
void gelu_backward(float* dx, const float* x, const float* dy, int64_t n);

// Attention: `att` and `scratch` are sized by attention_stash_elems / attention_scratch_elems
// (kernels.h) for the CUDA device; what `att` holds between forward and backward is this
// implementation's business (probabilities, or per-row log-sum-exp for a fused kernel).
void attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t NH);
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int64_t B, int64_t T, int64_t C, int64_t NH);
int64_t attention_stash_elems(int64_t B, int64_t NH, int64_t T);
int64_t attention_scratch_elems(int64_t B, int64_t NH, int64_t T);
namespace detail {
// Whether the calling thread's attention runs the fused (flash) kernels: off until set, per
// thread (the trainer sets it on each rank thread from --attention; kernels.h's
// set_fused_attention). Head dims 32, 64, 128 (others are refused while it is on); a T above
// flash_attention_max_T() runs the plain path.
void set_flash_attention(bool on);
bool flash_attention_enabled();
}  // namespace detail

void cross_entropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets,
                           int64_t n, int64_t V, int64_t Vp);
void cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                            const int32_t* targets, float dloss, int64_t n, int64_t V, int64_t Vp);

void embedding_forward(float* y, const int32_t* tokens, const float* wte, const float* wpe,
                       int64_t B, int64_t T, int64_t C);
void embedding_backward(float* dwte, float* dwpe, const float* dy, const int32_t* tokens, int64_t B,
                        int64_t T, int64_t C);

void add(float* y, const float* a, const float* b, int64_t n);
void accumulate(float* y, const float* x, int64_t n);
void scale(float* y, float s, int64_t n);
void copy(float* y, const float* x, int64_t n);
double sum_squares(const float* x, int64_t n);
double sum(const float* x, int64_t n);

void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t t);
// One launch for every segment (segs is a host array of n_segs entries).
void adamw_update_multi(float* param, const float* grad, float* m, float* v,
                        const AdamwSegment* segs, int64_t n_segs, float lr, float beta1,
                        float beta2, float eps, int64_t t, float grad_scale = 1.0f);

// ---- vocab_parallel.h
void vocab_parallel_max(float* mx, const float* logits, int64_t n, int64_t cols, int64_t real);
void vocab_parallel_sum_exp(float* sum_exp, float* target_logit, const float* logits,
                            const float* mx, const int32_t* targets, int64_t n, int64_t cols,
                            int64_t real, int64_t v0);
void vocab_parallel_lse(float* lse, float* losses, const float* mx, const float* sums, int64_t n);
void vocab_parallel_ce_backward(float* dlogits, const float* logits, const float* lse,
                                const int32_t* targets, float dloss, int64_t n, int64_t cols,
                                int64_t real, int64_t v0);
void vocab_parallel_embedding_forward(float* y, const int32_t* tokens, const float* wte, int64_t n,
                                      int64_t C, int64_t v0, int64_t rows);
void vocab_parallel_embedding_backward(float* dwte, const float* dy, const int32_t* tokens,
                                       int64_t n, int64_t C, int64_t v0, int64_t rows);
void add_position_embedding(float* y, const float* wpe, int64_t first, int64_t n, int64_t T,
                            int64_t C);
void position_embedding_backward(float* dwpe, const float* dy, int64_t first, int64_t n, int64_t T,
                                 int64_t C);
void add_bias(float* y, const float* b, int64_t n, int64_t c);

// ---- mixed.h
void to_bf16(bf16* y, const float* x, int64_t n);
void to_f32(float* y, const bf16* x, int64_t n);
void linear_forward_mixed(float* y, const bf16* x, const bf16* w, const float* b, int64_t n,
                          int64_t in, int64_t out);
void linear_forward_mixed(bf16* y, const bf16* x, const bf16* w, const float* b, int64_t n,
                          int64_t in, int64_t out);
void linear_backward_mixed(float* dx, float* dw, float* db, const float* dy, const bf16* x,
                           const bf16* w, int64_t n, int64_t in, int64_t out, bf16* ws,
                           int64_t ws_elems);
void adamw_update_mixed(float* master, bf16* param_out, const float* grad, float* m, float* v,
                        int64_t n, float lr, float beta1, float beta2, float eps,
                        float weight_decay, int64_t t);

// The measured bf16/f32 GEMM rate of the current GPU (FLOP/s) on an M=N=K=n product, for
// MFU and `meshtrain bench peak --device cuda` (median of `reps` timed runs with events).
double time_gemm_flops(int64_t n, bool bf16_operands, int reps);

// ---- microbenchmarks of `meshtrain calibrate --device cuda` (microbench.cu)
// FLOP/s of C[M, N] = A[M, K] B[N, K]^T (linear_forward's product), per call in a stream of
// back-to-back calls (the median of `reps` batches).
double time_gemm_shape(int64_t M, int64_t N, int64_t K, bool bf16_operands, int reps);
// The bf16 rate of every (m, n, k) of the grid, row-major [m][n][k], on buffers allocated
// once for the largest shape.
std::vector<double> time_gemm_table(const std::vector<double>& m, const std::vector<double>& n,
                                    const std::vector<double>& k, int reps);
// An n^3 bf16 GEMM's burst rate (after a second's rest) and its rate after `seconds` back to
// back, where the clock has fallen to what the power limit allows (the median of the last
// half of ~0.5 s windows).
struct SustainedRate {
  double burst_flops_per_s = 0, sustained_flops_per_s = 0;
  int windows = 0;
};
SustainedRate time_gemm_sustained(int64_t n, double seconds);
struct MemoryRates {
  double copy_bytes_per_s = 0;  // copy(): read + write
  double add_bytes_per_s = 0;   // add(): two reads + one write, our elementwise kernel
};
MemoryRates time_memory_rates(int64_t bytes, int reps);
struct LaunchTimes {
  double gpu_s = 0;   // per empty kernel, back to back on the GPU
  double host_s = 0;  // per launch call on the host (enqueue only)
};
LaunchTimes time_launches(int launches);
struct AttentionTimes {
  double forward_s = 0, backward_s = 0;  // per call of the fused (flash) kernels
};
AttentionTimes time_flash_attention(int64_t B, int64_t T, int64_t C, int64_t NH, int reps);
struct GpuInfo {
  std::string name;
  int sms = 0, cc_major = 0, cc_minor = 0;
  double memory_bytes = 0, sm_clock_hz = 0;
  double memory_bytes_per_s = 0;  // the data sheet's: memory clock x 2 x bus width
};
GpuInfo gpu_info();

}  // namespace mt::kernels::cuda

// Causal multi-head self-attention, the straightforward way (the CPU's semantics): for each
// batch row b, strided-batched f32 GEMMs over the NH heads (head h of q, k, v is the column
// block h*hd of qkv's row, so heads are `hd` floats apart with leading dim 3C), and a
// softmax kernel in between. att [B, NH, T, T] holds the probabilities, 0 above the
// diagonal; backward's scratch holds dP and then dS, same shape.
//
// When the calling thread has the fused path on (detail::set_flash_attention; the trainer's
// --attention, default fused for bf16 on a GPU) the kernels of flash_attention.cu run
// instead: att then holds the per-row log-sum-exp and scratch the rows' D = sum(dO * O),
// B*NH*T floats each. The plain path is the f32 one and the fused one's reference.
#include <cmath>

#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/context.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/kernels_cuda.h"

namespace mt::kernels::cuda {
namespace detail {
namespace {
// Per thread, like the thread's device (core/device.h): verify's CPU oracle and its GPU
// layout run in one process, and each rank thread holds the choice its buffers were sized for.
thread_local bool t_flash = false;
}  // namespace

void set_flash_attention(bool on) { t_flash = on; }

bool flash_attention_enabled() { return t_flash; }
}  // namespace detail

namespace {

using namespace detail;

void check_shape(const char* what, int64_t B, int64_t T, int64_t C, int64_t NH) {
  check_nonneg(what, "B", B);
  if (NH < 1 || C < 1 || C % NH != 0)
    fail_input(std::string(what) + ": C=" + str(C) + " is not divisible by NH=" + str(NH));
  if (T < 1) fail_input(std::string(what) + ": T must be >= 1, got " + str(T));
  if (B * NH * T > INT32_MAX)
    fail_input(std::string(what) + ": B*NH*T=" + str(B * NH * T) + " rows exceed 2^31-1");
}

// The fused path runs when it is enabled and T fits its grid. The head dim is not part of
// the choice: attention_stash_elems does not know it, and the buffers it sizes must fit the
// path that runs, so an unsupported head dim with the fused path enabled is refused (by
// flash_attention_forward / _backward) rather than falling back into a too-small `att`.
bool use_flash(int64_t T) { return flash_attention_enabled() && T <= flash_attention_max_T(); }

}  // namespace

void attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t NH) {
  check_shape("attention_forward", B, T, C, NH);
  if (use_flash(T)) return flash_attention_forward(out, att, qkv, B, T, C, NH);
  if (B == 0) return;
  const int64_t hd = C / NH, C3 = 3 * C, TT = T * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int64_t b = 0; b < B; ++b) {
    const float* q = qkv + b * T * C3;
    const float* k = q + C;
    float* p = att + b * NH * TT;
    // S[h] = scale * Q[h] K[h]^T (all T x T; the softmax zeroes the upper triangle)
    gemm_batched(false, true, T, T, hd, scale, q, C3, hd, k, C3, hd, 0.0f, p, T, TT, NH);
  }
  causal_softmax_kernel<<<static_cast<unsigned>(B * NH * T), kThreads, 0, stream()>>>(att, T);
  check_launch("causal_softmax_kernel");
  for (int64_t b = 0; b < B; ++b) {
    const float* v = qkv + b * T * C3 + 2 * C;
    // out[h] = P[h] V[h]
    gemm_batched(false, false, T, hd, T, 1.0f, att + b * NH * TT, T, TT, v, C3, hd, 0.0f,
                 out + b * T * C, C, hd, NH);
  }
}

void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int64_t B, int64_t T, int64_t C, int64_t NH) {
  check_shape("attention_backward", B, T, C, NH);
  if (use_flash(T)) return flash_attention_backward(dqkv, scratch, dout, qkv, att, B, T, C, NH);
  if (B == 0) return;
  const int64_t hd = C / NH, C3 = 3 * C, TT = T * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int64_t b = 0; b < B; ++b) {
    // dP[h] = dO[h] V[h]^T
    gemm_batched(false, true, T, T, hd, 1.0f, dout + b * T * C, C, hd, qkv + b * T * C3 + 2 * C,
                 C3, hd, 0.0f, scratch + b * NH * TT, T, TT, NH);
  }
  causal_softmax_backward_kernel<<<static_cast<unsigned>(B * NH * T), kThreads, 0, stream()>>>(
      scratch, att, T, scale);
  check_launch("causal_softmax_backward_kernel");
  for (int64_t b = 0; b < B; ++b) {
    const float* q = qkv + b * T * C3;
    const float* k = q + C;
    const float* ds = scratch + b * NH * TT;
    const float* p = att + b * NH * TT;
    const float* dO = dout + b * T * C;
    float* dq = dqkv + b * T * C3;
    // dQ[h] = dS[h] K[h]; dK[h] = dS[h]^T Q[h]; dV[h] = P[h]^T dO[h] (all overwritten)
    gemm_batched(false, false, T, hd, T, 1.0f, ds, T, TT, k, C3, hd, 0.0f, dq, C3, hd, NH);
    gemm_batched(true, false, T, hd, T, 1.0f, ds, T, TT, q, C3, hd, 0.0f, dq + C, C3, hd, NH);
    gemm_batched(true, false, T, hd, T, 1.0f, p, T, TT, dO, C, hd, 0.0f, dq + 2 * C, C3, hd, NH);
  }
}

int64_t attention_stash_elems(int64_t B, int64_t NH, int64_t T) {
  return use_flash(T) ? B * NH * T : B * NH * T * T;
}
int64_t attention_scratch_elems(int64_t B, int64_t NH, int64_t T) {
  return use_flash(T) ? B * NH * T : B * NH * T * T;
}

}  // namespace mt::kernels::cuda

// Causal multi-head self-attention, one (batch, head) pair per task, GEMMs in between.
// Rows are processed in blocks of kBlock: the GEMMs of row block [r0, r1) only touch
// keys [0, r1), which skips most of the masked upper triangle (at T = 256 and kBlock = 64
// they do 10/16 of the full T x T work).
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/kernels.h"
#include "kernels/vec_math.h"

namespace mt::kernels {
namespace {

constexpr int64_t kBlock = 64;

void check_shape(int64_t T, int64_t C, int64_t NH) {
  if (NH < 1 || C % NH != 0) fail("attention: C={} is not divisible by NH={}", C, NH);
  if (T < 1) fail("attention: T must be >= 1, got {}", T);
}

// Row t of p: softmax of s[0..t] in place, zeros after.
void causal_softmax_row(float* p, int64_t t, int64_t T) {
  float mx = p[0];
#pragma omp simd reduction(max : mx)
  for (int64_t j = 0; j <= t; ++j) mx = std::max(mx, p[j]);
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j <= t; ++j) {
    const float e = detail::fast_exp(p[j] - mx);
    p[j] = e;
    s += e;
  }
  const float inv = 1.0f / s;
#pragma omp simd
  for (int64_t j = 0; j <= t; ++j) p[j] *= inv;
  for (int64_t j = t + 1; j < T; ++j) p[j] = 0.0f;
}

}  // namespace

void attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t NH) {
  check_shape(T, C, NH);
  const int64_t hd = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // One task per (b, h); the GEMMs inside run single-threaded (oneDNN does not nest).
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < B * NH; ++bh) {
    const int64_t b = bh / NH, h = bh % NH;
    const float* q = qkv + b * T * C3 + h * hd;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* p = att + bh * T * T;
    float* o = out + b * T * C + h * hd;
    for (int64_t r0 = 0; r0 < T; r0 += kBlock) {
      const int64_t r1 = std::min(T, r0 + kBlock), rows = r1 - r0;
      gemm(false, true, rows, r1, hd, scale, q + r0 * C3, C3, k, C3, 0.0f, p + r0 * T, T);
      for (int64_t t = r0; t < r1; ++t) causal_softmax_row(p + t * T, t, T);
      gemm(false, false, rows, hd, r1, 1.0f, p + r0 * T, T, v, C3, 0.0f, o + r0 * C, C);
    }
  }
}

void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int64_t B, int64_t T, int64_t C, int64_t NH) {
  check_shape(T, C, NH);
  const int64_t hd = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < B * NH; ++bh) {
    const int64_t b = bh / NH, h = bh % NH;
    const float* q = qkv + b * T * C3 + h * hd;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* dq = dqkv + b * T * C3 + h * hd;
    float* dk = dq + C;
    float* dv = dq + 2 * C;
    const float* p = att + bh * T * T;
    const float* dO = dout + b * T * C + h * hd;
    float* ds = scratch + bh * T * T;
    // Row blocks: dP = dO V^T, then dS = P * (dP - rowsum(P * dP)) * scale (the softmax
    // backward, with the forward's scale folded in), then dQ = dS K.
    for (int64_t r0 = 0; r0 < T; r0 += kBlock) {
      const int64_t r1 = std::min(T, r0 + kBlock), rows = r1 - r0;
      gemm(false, true, rows, r1, hd, 1.0f, dO + r0 * C, C, v, C3, 0.0f, ds + r0 * T, T);
      for (int64_t t = r0; t < r1; ++t) {
        const float* pt = p + t * T;
        float* dst = ds + t * T;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t j = 0; j <= t; ++j) dot += pt[j] * dst[j];
#pragma omp simd
        for (int64_t j = 0; j <= t; ++j) dst[j] = pt[j] * (dst[j] - dot) * scale;
        for (int64_t j = t + 1; j < r1; ++j) dst[j] = 0.0f;
      }
      gemm(false, false, rows, hd, r1, 1.0f, ds + r0 * T, T, k, C3, 0.0f, dq + r0 * C3, C3);
    }
    // Column blocks: key j only receives from queries t >= j, so dK[c0:c1] = dS[c0:T,
    // c0:c1]^T Q[c0:T] and dV[c0:c1] = P[c0:T, c0:c1]^T dO[c0:T].
    for (int64_t c0 = 0; c0 < T; c0 += kBlock) {
      const int64_t c1 = std::min(T, c0 + kBlock), cols = c1 - c0;
      gemm(true, false, cols, hd, T - c0, 1.0f, ds + c0 * T + c0, T, q + c0 * C3, C3, 0.0f,
           dk + c0 * C3, C3);
      gemm(true, false, cols, hd, T - c0, 1.0f, p + c0 * T + c0, T, dO + c0 * C, C, 0.0f,
           dv + c0 * C3, C3);
    }
  }
}

}  // namespace mt::kernels

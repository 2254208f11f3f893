// Layer norm over the last dimension, eps 1e-5 (GPT-2).
#include <algorithm>
#include <cmath>

#include "kernels/dispatch.h"
#include "kernels/kernels.h"
#include "kernels/vec_math.h"

namespace mt::kernels {

namespace {

// Y: float, or bf16 (the output rounded once, for a GEMM input: the bits of to_bf16 of the
// f32 output).
template <typename Y>
void layernorm_rows(Y* y, float* mean, float* rstd, const float* x, const float* w, const float* b,
                    int64_t n, int64_t c) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * c;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < c; ++j) s += xi[j];
    const float m = s / static_cast<float>(c);
    // Two passes: the variance of centred values does not cancel catastrophically.
    float v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (int64_t j = 0; j < c; ++j) v += (xi[j] - m) * (xi[j] - m);
    const float r = 1.0f / std::sqrt(v / static_cast<float>(c) + 1e-5f);
    Y* yi = y + i * c;
    if (b) {
#pragma omp simd
      for (int64_t j = 0; j < c; ++j) detail::store(yi, j, (xi[j] - m) * r * w[j] + b[j]);
    } else {  // a model without biases
#pragma omp simd
      for (int64_t j = 0; j < c; ++j) detail::store(yi, j, (xi[j] - m) * r * w[j]);
    }
    mean[i] = m;
    rstd[i] = r;
  }
}

}  // namespace

void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int64_t n, int64_t c) {
  MT_CUDA_DISPATCH(layernorm_forward(y, mean, rstd, x, w, b, n, c));
  layernorm_rows(y, mean, rstd, x, w, b, n, c);
}

void layernorm_forward(bf16* y, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int64_t n, int64_t c) {
  MT_CUDA_DISPATCH(layernorm_forward(y, mean, rstd, x, w, b, n, c));
  layernorm_rows(y, mean, rstd, x, w, b, n, c);
}

void layernorm_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                        const float* w, const float* mean, const float* rstd, int64_t n,
                        int64_t c) {
  MT_CUDA_DISPATCH(layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, n, c));
  // dx, row by row.
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * c;
    const float* dyi = dy + i * c;
    const float m = mean[i], r = rstd[i];
    float sum_g = 0.0f, sum_gx = 0.0f;  // sums of g = dy*w and of g*xhat
#pragma omp simd reduction(+ : sum_g, sum_gx)
    for (int64_t j = 0; j < c; ++j) {
      const float g = dyi[j] * w[j];
      sum_g += g;
      sum_gx += g * (xi[j] - m) * r;
    }
    const float mg = sum_g / static_cast<float>(c), mgx = sum_gx / static_cast<float>(c);
    float* dxi = dx + i * c;
#pragma omp simd
    for (int64_t j = 0; j < c; ++j) {
      const float xhat = (xi[j] - m) * r;
      dxi[j] += (dyi[j] * w[j] - mg - xhat * mgx) * r;
    }
  }
  // dw, db: threads split the columns and sum rows in order, so no cross-thread reduction
  // and the same bits for any thread count.
  constexpr int64_t kCols = 64;
  const int64_t blocks = (c + kCols - 1) / kCols;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t j0 = blk * kCols, j1 = std::min(c, j0 + kCols);
    float aw[kCols] = {}, ab[kCols] = {};
    for (int64_t i = 0; i < n; ++i) {
      const float* xi = x + i * c;
      const float* dyi = dy + i * c;
      const float m = mean[i], r = rstd[i];
#pragma omp simd
      for (int64_t j = j0; j < j1; ++j) {
        aw[j - j0] += dyi[j] * (xi[j] - m) * r;
        ab[j - j0] += dyi[j];
      }
    }
    for (int64_t j = j0; j < j1; ++j) {
      dw[j] += aw[j - j0];
      if (db) db[j] += ab[j - j0];
    }
  }
}

}  // namespace mt::kernels

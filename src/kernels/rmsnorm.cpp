// RMSNorm over the last dimension (Llama): y = x / sqrt(mean(x²) + eps) · w, no mean
// subtraction and no bias. The CUDA twin: kernels/cuda/llama.cu.
#include <algorithm>
#include <cmath>

#include "kernels/dispatch.h"
#include "kernels/kernels.h"
#include "kernels/vec_math.h"

namespace mt::kernels {

namespace {

template <typename Y>  // float, or bf16: the output rounded once (a GEMM input)
void rmsnorm_rows(Y* y, float* rstd, const float* x, const float* w, int64_t n, int64_t c,
                  float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * c;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < c; ++j) s += xi[j] * xi[j];
    const float r = 1.0f / std::sqrt(s / static_cast<float>(c) + eps);
    Y* yi = y + i * c;
#pragma omp simd
    for (int64_t j = 0; j < c; ++j) detail::store(yi, j, xi[j] * r * w[j]);
    rstd[i] = r;
  }
}

}  // namespace

void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t n, int64_t c,
                     float eps) {
  MT_CUDA_DISPATCH(rmsnorm_forward(y, rstd, x, w, n, c, eps));
  rmsnorm_rows(y, rstd, x, w, n, c, eps);
}

void rmsnorm_forward(bf16* y, float* rstd, const float* x, const float* w, int64_t n, int64_t c,
                     float eps) {
  MT_CUDA_DISPATCH(rmsnorm_forward(y, rstd, x, w, n, c, eps));
  rmsnorm_rows(y, rstd, x, w, n, c, eps);
}

void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                      const float* rstd, int64_t n, int64_t c) {
  MT_CUDA_DISPATCH(rmsnorm_backward(dx, dw, dy, x, w, rstd, n, c));
  // With g = dy·w and x̂ = x·r: dx = r·(g − x̂·mean(g·x̂)).
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * c;
    const float* dyi = dy + i * c;
    const float r = rstd[i];
    float sum_gx = 0.0f;
#pragma omp simd reduction(+ : sum_gx)
    for (int64_t j = 0; j < c; ++j) sum_gx += dyi[j] * w[j] * xi[j] * r;
    const float mgx = sum_gx / static_cast<float>(c);
    float* dxi = dx + i * c;
#pragma omp simd
    for (int64_t j = 0; j < c; ++j) dxi[j] += (dyi[j] * w[j] - xi[j] * r * mgx) * r;
  }
  // dw: threads split the columns and sum rows in order (the same bits for any thread count).
  constexpr int64_t kCols = 64;
  const int64_t blocks = (c + kCols - 1) / kCols;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t j0 = blk * kCols, j1 = std::min(c, j0 + kCols);
    float aw[kCols] = {};
    for (int64_t i = 0; i < n; ++i) {
      const float* xi = x + i * c;
      const float* dyi = dy + i * c;
      const float r = rstd[i];
#pragma omp simd
      for (int64_t j = j0; j < j1; ++j) aw[j - j0] += dyi[j] * xi[j] * r;
    }
    for (int64_t j = j0; j < j1; ++j) dw[j] += aw[j - j0];
  }
}

}  // namespace mt::kernels

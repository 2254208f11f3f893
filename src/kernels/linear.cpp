// Linear layer on top of gemm. Weights are [out, in], so y = x w^T.
#include <algorithm>

#include "kernels/dispatch.h"
#include "kernels/gemm_internal.h"
#include "kernels/kernels.h"

namespace mt::kernels {

void linear_forward(float* y, const float* x, const float* w, const float* b, int64_t n, int64_t in,
                    int64_t out) {
  MT_CUDA_DISPATCH(linear_forward(y, x, w, b, n, in, out));
  gemm(false, true, n, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
  if (!b) return;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float* yi = y + i * out;
#pragma omp simd
    for (int64_t j = 0; j < out; ++j) yi[j] += b[j];
  }
}

void detail::bias_grad(float* db, const float* dy, int64_t n, int64_t out) {
  constexpr int64_t kCols = 64;
  const int64_t blocks = (out + kCols - 1) / kCols;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t j0 = blk * kCols, j1 = std::min(out, j0 + kCols);
    float acc[kCols] = {};
    for (int64_t i = 0; i < n; ++i) {
      const float* r = dy + i * out;
#pragma omp simd
      for (int64_t j = j0; j < j1; ++j) acc[j - j0] += r[j];
    }
    for (int64_t j = j0; j < j1; ++j) db[j] += acc[j - j0];
  }
}

void linear_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                     const float* w, int64_t n, int64_t in, int64_t out) {
  MT_CUDA_DISPATCH(linear_backward(dx, dw, db, dy, x, w, n, in, out));
  if (dx) gemm(false, false, n, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
  if (dw) gemm(true, false, out, in, n, 1.0f, dy, out, x, in, 1.0f, dw, in);
  if (db) detail::bias_grad(db, dy, n, out);
}

}  // namespace mt::kernels

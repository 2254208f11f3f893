// Token + position embeddings.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "kernels/dispatch.h"
#include "kernels/kernels.h"

namespace mt::kernels {

void embedding_forward(float* y, const int32_t* tokens, const float* wte, const float* wpe,
                       int64_t B, int64_t T, int64_t C) {
  MT_CUDA_DISPATCH(embedding_forward(y, tokens, wte, wpe, B, T, C));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < B * T; ++i) {
    const float* e = wte + static_cast<int64_t>(tokens[i]) * C;
    float* yi = y + i * C;
    if (!wpe) {  // rotary positions: no table
      std::copy(e, e + C, yi);
      continue;
    }
    const float* p = wpe + (i % T) * C;
#pragma omp simd
    for (int64_t j = 0; j < C; ++j) yi[j] = e[j] + p[j];
  }
}

// Threads split the columns; every thread walks all positions in order, so repeated tokens
// accumulate in a fixed order (no atomics) and the bits do not depend on the thread count.
void embedding_backward(float* dwte, float* dwpe, const float* dy, const int32_t* tokens, int64_t B,
                        int64_t T, int64_t C) {
  MT_CUDA_DISPATCH(embedding_backward(dwte, dwpe, dy, tokens, B, T, C));
  constexpr int64_t kCols = 64;
  const int64_t blocks = (C + kCols - 1) / kCols;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t j0 = blk * kCols, j1 = std::min(C, j0 + kCols);
    for (int64_t i = 0; i < B * T; ++i) {
      const float* d = dy + i * C;
      float* e = dwte + static_cast<int64_t>(tokens[i]) * C;
#pragma omp simd
      for (int64_t j = j0; j < j1; ++j) e[j] += d[j];
    }
    if (!dwpe) continue;
    for (int64_t t = 0; t < T; ++t) {
      float* p = dwpe + t * C;
      for (int64_t b = 0; b < B; ++b) {
        const float* d = dy + (b * T + t) * C;
#pragma omp simd
        for (int64_t j = j0; j < j1; ++j) p[j] += d[j];
      }
    }
  }
}

}  // namespace mt::kernels

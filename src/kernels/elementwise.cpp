#include <omp.h>

#include <algorithm>
#include <cstring>

#include "kernels/dispatch.h"
#include "kernels/kernels.h"

namespace mt::kernels {

void add(float* y, const float* a, const float* b, int64_t n) {
  MT_CUDA_DISPATCH(add(y, a, b, n));
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

void accumulate(float* y, const float* x, int64_t n) {
  MT_CUDA_DISPATCH(accumulate(y, x, n));
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void scale(float* y, float s, int64_t n) {
  MT_CUDA_DISPATCH(scale(y, s, n));
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] *= s;
}

void zero(float* y, int64_t n) {
  // Below this a parallel region costs more than it saves (and libgomp allocates its team
  // even for a region of one thread: the steady-state allocation tests count them).
  constexpr int64_t kParallelElems = int64_t{1} << 18;
  if (n < kParallelElems) {
    if (n > 0) std::memset(y, 0, static_cast<size_t>(n) * sizeof(float));
    return;
  }
#pragma omp parallel
  {
    // Each thread one contiguous range, its ends on 64-byte lines where y is aligned.
    const int64_t team = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t lo = n * t / team / 16 * 16,
                  hi = t + 1 == team ? n : n * (t + 1) / team / 16 * 16;
    if (hi > lo) std::memset(y + lo, 0, static_cast<size_t>(hi - lo) * sizeof(float));
  }
}

void copy(float* y, const float* x, int64_t n) {
  MT_CUDA_DISPATCH(copy(y, x, n));
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i];
}

// A fixed number of chunks, each summed in double, then the chunk sums added in order: the
// split never depends on the thread count, so neither do the bits.
double sum_squares(const float* x, int64_t n) {
  MT_CUDA_DISPATCH(sum_squares(x, n));
  constexpr int kChunks = 256;
  double part[kChunks];
#pragma omp parallel for schedule(static)
  for (int c = 0; c < kChunks; ++c) {
    const int64_t i0 = n * c / kChunks, i1 = n * (c + 1) / kChunks;
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = i0; i < i1; ++i) s += static_cast<double>(x[i]) * x[i];
    part[c] = s;
  }
  double total = 0.0;
  for (int c = 0; c < kChunks; ++c) total += part[c];
  return total;
}

// In order, in double: n is small (a microbatch's losses).
double sum(const float* x, int64_t n) {
  MT_CUDA_DISPATCH(sum(x, n));
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += x[i];
  return s;
}

}  // namespace mt::kernels

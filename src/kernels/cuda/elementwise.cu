// Elementwise kernels: add, accumulate, scale, copy and the bias add of [n, c] rows.
#include "kernels/cuda/context.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/elementwise_kernels.cuh"
#include "kernels/cuda/kernels_cuda.h"

// The kernels (in the *_kernels.cuh) are done with it.
#undef MT_GRID_STRIDE

namespace mt::kernels::cuda {
namespace {

using detail::check_launch;
using detail::grid_for;
using detail::kThreads;
using detail::stream;

}  // namespace

void detail::launch_add_bias(float* y, const float* b, int64_t n, int64_t c) {
  check_nonneg("add_bias", "n", n);
  check_nonneg("add_bias", "c", c);
  if (n * c == 0) return;
  add_bias_kernel<<<grid_for(n * c), kThreads, 0, stream()>>>(y, b, n, c);
  check_launch("add_bias_kernel");
}

void add(float* y, const float* a, const float* b, int64_t n) {
  detail::check_nonneg("add", "n", n);
  if (n == 0) return;
  add_kernel<<<grid_for(n), kThreads, 0, stream()>>>(y, a, b, n);
  check_launch("add_kernel");
}

void accumulate(float* y, const float* x, int64_t n) {
  detail::check_nonneg("accumulate", "n", n);
  if (n == 0) return;
  accumulate_kernel<<<grid_for(n), kThreads, 0, stream()>>>(y, x, n);
  check_launch("accumulate_kernel");
}

void scale(float* y, float s, int64_t n) {
  detail::check_nonneg("scale", "n", n);
  if (n == 0) return;
  scale_kernel<<<grid_for(n), kThreads, 0, stream()>>>(y, s, n);
  check_launch("scale_kernel");
}

void copy(float* y, const float* x, int64_t n) {
  detail::check_nonneg("copy", "n", n);
  if (n == 0) return;
  detail::check_cuda(cudaMemcpyAsync(y, x, static_cast<size_t>(n) * sizeof(float),
                                     cudaMemcpyDeviceToDevice, stream()),
                     "cudaMemcpyAsync (copy)");
}

void add_bias(float* y, const float* b, int64_t n, int64_t c) { detail::launch_add_bias(y, b, n, c); }

}  // namespace mt::kernels::cuda

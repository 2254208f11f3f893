// GELU, tanh approximation (GPT-2), with the CPU's formula: 0.5 x (1 + tanh(u)) computed as
// x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3).
#include "kernels/cuda/context.h"
#include "kernels/cuda/gelu_kernels.cuh"
#include "kernels/cuda/kernels_cuda.h"

namespace mt::kernels::cuda {
namespace {

using namespace detail;

}  // namespace

void gelu_forward(float* y, const float* x, int64_t n) {
  check_nonneg("gelu_forward", "n", n);
  if (n == 0) return;
  gelu_forward_kernel<<<grid_for(n), kThreads, 0, stream()>>>(y, x, n);
  check_launch("gelu_forward_kernel");
}

void gelu_forward(bf16* y, const float* x, int64_t n) {
  check_nonneg("gelu_forward", "n", n);
  if (n == 0) return;
  gelu_forward_kernel<<<grid_for(n), kThreads, 0, stream()>>>(reinterpret_cast<uint16_t*>(y), x, n);
  check_launch("gelu_forward_kernel");
}

void gelu_backward(float* dx, const float* x, const float* dy, int64_t n) {
  check_nonneg("gelu_backward", "n", n);
  if (n == 0) return;
  gelu_backward_kernel<<<grid_for(n), kThreads, 0, stream()>>>(dx, x, dy, n);
  check_launch("gelu_backward_kernel");
}

}  // namespace mt::kernels::cuda

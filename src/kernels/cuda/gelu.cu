// GELU, tanh approximation (GPT-2), with the CPU's formula: 0.5 x (1 + tanh(u)) computed as
// x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3).
#include "kernels/cuda/context.h"
#include "kernels/cuda/kernels_cuda.h"

namespace mt::kernels::cuda {
namespace {

using namespace detail;

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCoef = 0.044715f;

__global__ void gelu_forward_kernel(float* y, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = x[i];
    const float u = kSqrt2OverPi * (v + kCoef * v * v * v);
    y[i] = v / (1.0f + expf(-2.0f * u));
  }
}

__global__ void gelu_backward_kernel(float* dx, const float* x, const float* dy, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = x[i];
    const float u = kSqrt2OverPi * (v + kCoef * v * v * v);
    const float s = 1.0f / (1.0f + expf(-2.0f * u));
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCoef * v * v);
    // d/dx [x s(2u)] = s + x s (1 - s) 2 u'
    dx[i] = dy[i] * (s + v * s * (1.0f - s) * 2.0f * du);
  }
}

}  // namespace

void gelu_forward(float* y, const float* x, int64_t n) {
  check_nonneg("gelu_forward", "n", n);
  if (n == 0) return;
  gelu_forward_kernel<<<grid_for(n), kThreads, 0, stream()>>>(y, x, n);
  check_launch("gelu_forward_kernel");
}

void gelu_backward(float* dx, const float* x, const float* dy, int64_t n) {
  check_nonneg("gelu_backward", "n", n);
  if (n == 0) return;
  gelu_backward_kernel<<<grid_for(n), kThreads, 0, stream()>>>(dx, x, dy, n);
  check_launch("gelu_backward_kernel");
}

}  // namespace mt::kernels::cuda

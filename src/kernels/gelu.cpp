// GELU, tanh approximation (GPT-2): 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
// Since 0.5 (1 + tanh(u)) = sigmoid(2u), we compute x * sigmoid(2u) with a vectorised exp.
#include "kernels/dispatch.h"
#include "kernels/kernels.h"
#include "kernels/vec_math.h"

namespace mt::kernels {
namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCoef = 0.044715f;
}  // namespace

namespace {
template <typename Y>  // float, or bf16: the output rounded once (a GEMM input)
void gelu_elems(Y* y, const float* x, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float u = kSqrt2OverPi * (v + kCoef * v * v * v);
    detail::store(y, i, v / (1.0f + detail::fast_exp(-2.0f * u)));
  }
}
}  // namespace

void gelu_forward(float* y, const float* x, int64_t n) {
  MT_CUDA_DISPATCH(gelu_forward(y, x, n));
  gelu_elems(y, x, n);
}

void gelu_forward(bf16* y, const float* x, int64_t n) {
  MT_CUDA_DISPATCH(gelu_forward(y, x, n));
  gelu_elems(y, x, n);
}

void gelu_backward(float* dx, const float* x, const float* dy, int64_t n) {
  MT_CUDA_DISPATCH(gelu_backward(dx, x, dy, n));
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float u = kSqrt2OverPi * (v + kCoef * v * v * v);
    const float s = 1.0f / (1.0f + detail::fast_exp(-2.0f * u));
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCoef * v * v);
    // d/dx [x s(2u)] = s + x s (1 - s) 2 u'
    dx[i] = dy[i] * (s + v * s * (1.0f - s) * 2.0f * du);
  }
}

}  // namespace mt::kernels

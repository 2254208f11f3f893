// SwiGLU's gate (Llama's MLP: down(silu(gate(x)) · up(x))): h holds each row's gate | up
// halves, f wide each; y = silu(gate) · up. The CUDA twin: kernels/cuda/llama.cu.
#include "kernels/dispatch.h"
#include "kernels/kernels.h"
#include "kernels/vec_math.h"

namespace mt::kernels {

namespace {
// fast_exp, not std::exp: libm's expf is not vectorised, and with it this gate cost 4-6%
// of a Llama step on one core (bench/vs-pytorch-llama). fast_exp clamps its argument, so a
// gate of any size gives a sigmoid in [0, 1], never a NaN.
inline float sigmoid(float g) { return 1.0f / (1.0f + detail::fast_exp(-g)); }
}  // namespace

namespace {
template <typename Y>  // float, or bf16: the output rounded once (a GEMM input)
void swiglu_rows(Y* y, const float* h, int64_t n, int64_t f) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float* gate = h + i * 2 * f;
    const float* up = gate + f;
    Y* yi = y + i * f;
#pragma omp simd
    for (int64_t j = 0; j < f; ++j) detail::store(yi, j, gate[j] * sigmoid(gate[j]) * up[j]);
  }
}
}  // namespace

void swiglu_forward(float* y, const float* h, int64_t n, int64_t f) {
  MT_CUDA_DISPATCH(swiglu_forward(y, h, n, f));
  swiglu_rows(y, h, n, f);
}

void swiglu_forward(bf16* y, const float* h, int64_t n, int64_t f) {
  MT_CUDA_DISPATCH(swiglu_forward(y, h, n, f));
  swiglu_rows(y, h, n, f);
}

void swiglu_backward(float* dh, const float* h, const float* dy, int64_t n, int64_t f) {
  MT_CUDA_DISPATCH(swiglu_backward(dh, h, dy, n, f));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float* gate = h + i * 2 * f;
    const float* up = gate + f;
    const float* dyi = dy + i * f;
    float* dgate = dh + i * 2 * f;
    float* dup = dgate + f;
#pragma omp simd
    for (int64_t j = 0; j < f; ++j) {
      const float g = gate[j], sg = sigmoid(g), silu = g * sg;
      dup[j] = dyi[j] * silu;
      dgate[j] = dyi[j] * up[j] * sg * (1.0f + g * (1.0f - sg));
    }
  }
}

}  // namespace mt::kernels

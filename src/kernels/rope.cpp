// Rotary position embeddings, Hugging Face's convention (`rotate_half`): in each head of
// hd dims, dimension i < hd/2 pairs with i + hd/2 and the pair turns by the angle
// pos·inv_freq[i]. The tables cos/sin [T, hd/2] come from the model (model/rope.h). The CUDA
// twin: kernels/cuda/llama.cu.
#include "kernels/dispatch.h"
#include "kernels/kernels.h"

namespace mt::kernels {

namespace {
// sign +1: the rotation; -1: its transpose (the inverse), which is backward's.
void rotate(float* x, int64_t B, int64_t T, int64_t row_stride, int64_t col0, int64_t heads,
            int64_t hd, const float* cos, const float* sin, float sign) {
  const int64_t half = hd / 2;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const float* c = cos + t * half;
      const float* s = sin + t * half;
      float* row = x + (b * T + t) * row_stride + col0;
      for (int64_t h = 0; h < heads; ++h) {
        float* v = row + h * hd;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const float a = v[i], z = v[i + half], si = sign * s[i];
          v[i] = a * c[i] - z * si;
          v[i + half] = z * c[i] + a * si;
        }
      }
    }
}
}  // namespace

void rope_forward(float* x, int64_t B, int64_t T, int64_t row_stride, int64_t col0, int64_t heads,
                  int64_t hd, const float* cos, const float* sin) {
  MT_CUDA_DISPATCH(rope_forward(x, B, T, row_stride, col0, heads, hd, cos, sin));
  rotate(x, B, T, row_stride, col0, heads, hd, cos, sin, 1.0f);
}

void rope_backward(float* dx, int64_t B, int64_t T, int64_t row_stride, int64_t col0, int64_t heads,
                   int64_t hd, const float* cos, const float* sin) {
  MT_CUDA_DISPATCH(rope_backward(dx, B, T, row_stride, col0, heads, hd, cos, sin));
  rotate(dx, B, T, row_stride, col0, heads, hd, cos, sin, -1.0f);
}

}  // namespace mt::kernels

// Grouped-query attention around the multi-head kernel: the key/value heads are repeated
// to one per query head before it (Hugging Face's repeat_kv: kv head k serves query heads
// k·g .. k·g + g − 1, g = heads / kv_heads), and backward sums each group's key/value
// gradients back, in order. The CUDA twin: kernels/cuda/llama.cu.
#include <algorithm>

#include "kernels/dispatch.h"
#include "kernels/kernels.h"

namespace mt::kernels {

void expand_kv_heads(float* full, const float* qkv, int64_t n, int64_t heads, int64_t kv_heads,
                     int64_t hd) {
  MT_CUDA_DISPATCH(expand_kv_heads(full, qkv, n, heads, kv_heads, hd));
  const int64_t C = heads * hd, Ckv = kv_heads * hd, g = heads / kv_heads;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float* src = qkv + i * (C + 2 * Ckv);
    float* dst = full + i * 3 * C;
    std::copy(src, src + C, dst);
    for (int64_t part = 1; part <= 2; ++part)  // k, then v
      for (int64_t h = 0; h < heads; ++h) {
        const float* kv = src + C + (part - 1) * Ckv + (h / g) * hd;
        std::copy(kv, kv + hd, dst + part * C + h * hd);
      }
  }
}

void reduce_kv_heads(float* dqkv, const float* dfull, int64_t n, int64_t heads, int64_t kv_heads,
                     int64_t hd) {
  MT_CUDA_DISPATCH(reduce_kv_heads(dqkv, dfull, n, heads, kv_heads, hd));
  const int64_t C = heads * hd, Ckv = kv_heads * hd, g = heads / kv_heads;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float* src = dfull + i * 3 * C;
    float* dst = dqkv + i * (C + 2 * Ckv);
    std::copy(src, src + C, dst);
    for (int64_t part = 1; part <= 2; ++part)
      for (int64_t k = 0; k < kv_heads; ++k) {
        float* out = dst + C + (part - 1) * Ckv + k * hd;
        const float* first = src + part * C + k * g * hd;
        std::copy(first, first + hd, out);
        for (int64_t m = 1; m < g; ++m) {
          const float* more = first + m * hd;
          for (int64_t j = 0; j < hd; ++j) out[j] += more[j];
        }
      }
  }
}

}  // namespace mt::kernels

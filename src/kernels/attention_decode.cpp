// Attention of one new position over the cached keys and values (kernels.h
// attention_decode): what generation with a KV cache runs per token, O(len) per head
// instead of the O(len²) of recomputing every position. The CPU only.
#include <cmath>

#include "kernels/kernels.h"

namespace mt::kernels {

void attention_decode(float* out, float* scores, const float* q, const float* k, const float* v,
                      int64_t len, int64_t heads, int64_t kv_heads, int64_t hd) {
  const int64_t group = heads / kv_heads, kv_stride = kv_heads * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
#pragma omp parallel for schedule(static)
  for (int64_t h = 0; h < heads; ++h) {
    const float* qh = q + h * hd;
    const int64_t kv_col = (h / group) * hd;
    float* s = scores + h * len;
    float mx = -INFINITY;
    for (int64_t t = 0; t < len; ++t) {
      const float* kt = k + t * kv_stride + kv_col;
      float dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t i = 0; i < hd; ++i) dot += qh[i] * kt[i];
      s[t] = dot * scale;
      mx = std::fmax(mx, s[t]);
    }
    float sum = 0;
    for (int64_t t = 0; t < len; ++t) {
      s[t] = std::exp(s[t] - mx);
      sum += s[t];
    }
    float* oh = out + h * hd;
    for (int64_t i = 0; i < hd; ++i) oh[i] = 0;
    const float inv = 1.0f / sum;
    for (int64_t t = 0; t < len; ++t) {
      const float p = s[t] * inv;
      const float* vt = v + t * kv_stride + kv_col;
#pragma omp simd
      for (int64_t i = 0; i < hd; ++i) oh[i] += p * vt[i];
    }
  }
}

}  // namespace mt::kernels

#include "kernels/vocab_parallel.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/dispatch.h"
#include "kernels/vec_math.h"

namespace mt::kernels {

void vocab_parallel_max(float* mx, const float* logits, int64_t n, int64_t cols, int64_t real) {
  MT_CUDA_DISPATCH(vocab_parallel_max(mx, logits, n, cols, real));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float* x = logits + i * cols;
    float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < real; ++j) m = detail::max_of(m, x[j]);
    mx[i] = m;
  }
}

void vocab_parallel_sum_exp(float* sum_exp, float* target_logit, const float* logits,
                            const float* mx, const int32_t* targets, int64_t n, int64_t cols,
                            int64_t real, int64_t v0) {
  MT_CUDA_DISPATCH(
      vocab_parallel_sum_exp(sum_exp, target_logit, logits, mx, targets, n, cols, real, v0));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float* x = logits + i * cols;
    const float m = mx[i];
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < real; ++j) s += detail::fast_exp(x[j] - m);
    sum_exp[i] = s;
    const int64_t t = static_cast<int64_t>(targets[i]) - v0;
    target_logit[i] = t >= 0 && t < real ? x[t] : 0.0f;
  }
}

void vocab_parallel_lse(float* lse, float* losses, const float* mx, const float* sums, int64_t n) {
  MT_CUDA_DISPATCH(vocab_parallel_lse(lse, losses, mx, sums, n));
  for (int64_t i = 0; i < n; ++i) {
    lse[i] = mx[i] + std::log(sums[i]);
    losses[i] = lse[i] - sums[n + i];
  }
}

void vocab_parallel_ce_backward(float* dlogits, const float* logits, const float* lse,
                                const int32_t* targets, float dloss, int64_t n, int64_t cols,
                                int64_t real, int64_t v0) {
  MT_CUDA_DISPATCH(
      vocab_parallel_ce_backward(dlogits, logits, lse, targets, dloss, n, cols, real, v0));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float* x = logits + i * cols;
    float* d = dlogits + i * cols;
    const float l = lse[i];
    const int64_t t = static_cast<int64_t>(targets[i]) - v0;
    const bool mine = t >= 0 && t < real;
    const float xt = mine ? x[t] : 0.0f;  // read before the row is overwritten
#pragma omp simd
    for (int64_t j = 0; j < real; ++j) d[j] = detail::fast_exp(x[j] - l) * dloss;
    if (mine) d[t] = (detail::fast_exp(xt - l) - 1.0f) * dloss;
    for (int64_t j = std::max<int64_t>(real, 0); j < cols; ++j) d[j] = 0.0f;
  }
}

void vocab_parallel_embedding_forward(float* y, const int32_t* tokens, const float* wte, int64_t n,
                                      int64_t C, int64_t v0, int64_t rows) {
  MT_CUDA_DISPATCH(vocab_parallel_embedding_forward(y, tokens, wte, n, C, v0, rows));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = static_cast<int64_t>(tokens[i]) - v0;
    float* out = y + i * C;
    if (r >= 0 && r < rows) {
      const float* w = wte + r * C;
      for (int64_t c = 0; c < C; ++c) out[c] = w[c];
    } else {
      for (int64_t c = 0; c < C; ++c) out[c] = 0.0f;
    }
  }
}

void vocab_parallel_embedding_backward(float* dwte, const float* dy, const int32_t* tokens,
                                       int64_t n, int64_t C, int64_t v0, int64_t rows) {
  MT_CUDA_DISPATCH(vocab_parallel_embedding_backward(dwte, dy, tokens, n, C, v0, rows));
  // Serial over tokens (two tokens may share a row); fixed order, so deterministic.
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = static_cast<int64_t>(tokens[i]) - v0;
    if (r < 0 || r >= rows) continue;
    float* w = dwte + r * C;
    const float* g = dy + i * C;
    for (int64_t c = 0; c < C; ++c) w[c] += g[c];
  }
}

void add_position_embedding(float* y, const float* wpe, int64_t first, int64_t n, int64_t T,
                            int64_t C) {
  MT_CUDA_DISPATCH(add_position_embedding(y, wpe, first, n, T, C));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float* p = wpe + ((first + i) % T) * C;
    float* out = y + i * C;
    for (int64_t c = 0; c < C; ++c) out[c] += p[c];
  }
}

void position_embedding_backward(float* dwpe, const float* dy, int64_t first, int64_t n, int64_t T,
                                 int64_t C) {
  MT_CUDA_DISPATCH(position_embedding_backward(dwpe, dy, first, n, T, C));
  for (int64_t i = 0; i < n; ++i) {
    float* p = dwpe + ((first + i) % T) * C;
    const float* g = dy + i * C;
    for (int64_t c = 0; c < C; ++c) p[c] += g[c];
  }
}

void add_position_rows(float* y, const float* wpe, const int32_t* pos, int64_t first, int64_t n,
                       int64_t T, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float* p = wpe + pos[(first + i) % T] * C;
    float* out = y + i * C;
    for (int64_t c = 0; c < C; ++c) out[c] += p[c];
  }
}

void position_rows_backward(float* dwpe, const float* dy, const int32_t* pos, int64_t first,
                            int64_t n, int64_t T, int64_t C) {
  for (int64_t i = 0; i < n; ++i) {  // in row order: the same sums as the single rank's
    float* p = dwpe + pos[(first + i) % T] * C;
    const float* g = dy + i * C;
    for (int64_t c = 0; c < C; ++c) p[c] += g[c];
  }
}

void add_bias(float* y, const float* b, int64_t n, int64_t c) {
  MT_CUDA_DISPATCH(add_bias(y, b, n, c));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float* out = y + i * c;
    for (int64_t j = 0; j < c; ++j) out[j] += b[j];
  }
}

}  // namespace mt::kernels

// Fused softmax + cross-entropy over a vocabulary padded from V to Vp columns; the padding
// columns are never read in forward and get a zero gradient in backward.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/dispatch.h"
#include "kernels/kernels.h"
#include "kernels/vec_math.h"

namespace mt::kernels {
namespace {

void check_target(int32_t t, int64_t i, int64_t V) {
  if (t < 0 || t >= V) fail("cross_entropy: target {} of row {} is outside [0, {})", t, i, V);
}

}  // namespace

void cross_entropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets,
                           int64_t n, int64_t V, int64_t Vp) {
  MT_CUDA_DISPATCH(cross_entropy_forward(losses, lse, logits, targets, n, V, Vp));
  if (V < 1 || Vp < V) fail("cross_entropy: need 1 <= V <= Vp, got V={} Vp={}", V, Vp);
  for (int64_t i = 0; i < n; ++i) check_target(targets[i], i, V);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float* x = logits + i * Vp;
    float mx = x[0];
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < V; ++j) mx = detail::max_of(mx, x[j]);
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < V; ++j) s += detail::fast_exp(x[j] - mx);
    const float l = mx + std::log(s);
    lse[i] = l;
    losses[i] = l - x[targets[i]];
  }
}

void cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                            const int32_t* targets, float dloss, int64_t n, int64_t V, int64_t Vp) {
  MT_CUDA_DISPATCH(cross_entropy_backward(dlogits, logits, lse, targets, dloss, n, V, Vp));
  if (V < 1 || Vp < V) fail("cross_entropy: need 1 <= V <= Vp, got V={} Vp={}", V, Vp);
  for (int64_t i = 0; i < n; ++i) check_target(targets[i], i, V);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float* x = logits + i * Vp;
    float* d = dlogits + i * Vp;
    const float l = lse[i];
    const int64_t t = targets[i];
    const float xt = x[t];  // read before the row is overwritten (dlogits may alias logits)
    // No restrict: d and x may be the same row, element j reads x[j] then writes d[j].
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) d[j] = detail::fast_exp(x[j] - l) * dloss;
    d[t] = (detail::fast_exp(xt - l) - 1.0f) * dloss;
    for (int64_t j = V; j < Vp; ++j) d[j] = 0.0f;
  }
}

}  // namespace mt::kernels

// AdamW (Loshchilov & Hutter): weight decay decoupled from the gradient, applied with the
// learning rate to the parameter itself; moments bias-corrected for step t >= 1.
#include <cmath>

#include "core/error.h"
#include "kernels/dispatch.h"
#include "kernels/kernels.h"
#include "kernels/mixed.h"
#include "kernels/vec_math.h"

namespace mt::kernels {
namespace {

// One loop for both entry points, so that the master weights of adamw_update_mixed get the
// very bits adamw_update would give them; kBf16Copy also writes param_out = bf16(param) in
// the same pass (not a second read of param).
template <bool kBf16Copy>
void adamw_impl(float* param, bf16* param_out, const float* grad, float* m, float* v, int64_t n,
                float lr, float beta1, float beta2, float eps, float weight_decay, int64_t t,
                const char* what, float grad_scale = 1.0f) {
  if (t < 1) fail("{}: step t must be >= 1, got {}", what, t);
  const float c1 = 1.0f / static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), t));
  const float c2 = 1.0f / static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), t));
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] * grad_scale;  // exact at 1
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi * c1, vhat = vi * c2;
    const float p = param[i] - lr * (mhat / (std::sqrt(vhat) + eps) + weight_decay * param[i]);
    param[i] = p;
    if constexpr (kBf16Copy) param_out[i].bits = detail::bf16_bits(p);
  }
}

}  // namespace

void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t t) {
  MT_CUDA_DISPATCH(adamw_update(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, t));
  adamw_impl<false>(param, nullptr, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, t,
                    "adamw_update");
}

void adamw_update_multi(float* param, const float* grad, float* m, float* v,
                        const AdamwSegment* segs, int64_t n_segs, float lr, float beta1,
                        float beta2, float eps, int64_t t, float grad_scale) {
  MT_CUDA_DISPATCH(
      adamw_update_multi(param, grad, m, v, segs, n_segs, lr, beta1, beta2, eps, t, grad_scale));
  for (int64_t k = 0; k < n_segs; ++k) {
    const AdamwSegment& g = segs[k];
    if (g.bf16_out)
      adamw_impl<true>(param + g.offset, g.bf16_out, grad + g.offset, m + g.offset, v + g.offset,
                       g.n, lr, beta1, beta2, eps, g.weight_decay, t, "adamw_update_multi",
                       grad_scale);
    else
      adamw_impl<false>(param + g.offset, nullptr, grad + g.offset, m + g.offset, v + g.offset, g.n,
                        lr, beta1, beta2, eps, g.weight_decay, t, "adamw_update_multi", grad_scale);
  }
}

void adamw_update_mixed(float* master, bf16* param_out, const float* grad, float* m, float* v,
                        int64_t n, float lr, float beta1, float beta2, float eps,
                        float weight_decay, int64_t t) {
  MT_CUDA_DISPATCH(
      adamw_update_mixed(master, param_out, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, t));
  if (!param_out) fail("adamw_update_mixed: param_out (the bf16 copy) is null");
  adamw_impl<true>(master, param_out, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, t,
                   "adamw_update_mixed");
}

}  // namespace mt::kernels

// AdamW (Loshchilov & Hutter): weight decay decoupled from the gradient, applied with the
// learning rate to the parameter itself; moments bias-corrected for step t >= 1.
#include <cmath>

#include "core/error.h"
#include "kernels/kernels.h"

namespace mt::kernels {

void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t t) {
  if (t < 1) fail("adamw_update: step t must be >= 1, got {}", t);
  const float c1 = 1.0f / static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), t));
  const float c2 = 1.0f / static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), t));
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i];
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi * c1, vhat = vi * c2;
    param[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + weight_decay * param[i]);
  }
}

}  // namespace mt::kernels

#include "train/optimizer.h"

#include <cmath>

#include "core/profile.h"
#include "kernels/kernels.h"

namespace mt::train {

AdamW::AdamW(model::ParamStore& params, AdamWConfig config)
    : params_(&params),
      config_(config),
      m_(Tensor::zeros({params.numel()}, DType::kF32, mem::Category::kOptimizer)),
      v_(Tensor::zeros({params.numel()}, DType::kF32, mem::Category::kOptimizer)) {}

void AdamW::step(float lr) {
  profile::Scope p("optimizer");
  ++t_;
  for (auto& prm : params_->params()) {
    const int64_t off = prm.offset_elems, n = prm.value.numel();
    kernels::adamw_update(prm.value.f32(), prm.grad.f32(), m_.f32() + off, v_.f32() + off, n,
                          lr, config_.beta1, config_.beta2, config_.eps,
                          prm.spec.weight_decay ? config_.weight_decay : 0.f, t_);
  }
}

float lr_at(int64_t step, int64_t warmup_steps, int64_t total_steps, float lr_max,
            float min_ratio) {
  if (step < warmup_steps) return lr_max * static_cast<float>(step + 1) / static_cast<float>(warmup_steps);
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - warmup_steps);
  const double progress = std::min(1.0, static_cast<double>(step - warmup_steps) / decay_steps);
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return static_cast<float>(lr_max * (min_ratio + (1.0 - min_ratio) * cosine));
}

double grad_norm(model::ParamStore& params) {
  Tensor& g = params.flat_grads();
  return std::sqrt(kernels::sum_squares(g.f32(), g.numel()));
}

double clip_grad_norm(model::ParamStore& params, double max_norm) {
  const double norm = grad_norm(params);
  if (max_norm > 0 && norm > max_norm) {
    Tensor& g = params.flat_grads();
    kernels::scale(g.f32(), static_cast<float>(max_norm / (norm + 1e-6)), g.numel());
  }
  return norm;
}

}  // namespace mt::train

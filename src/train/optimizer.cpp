#include "train/optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/profile.h"
#include "kernels/kernels.h"

namespace mt::train {

AdamW::AdamW(model::ParamStore& params, AdamWConfig config)
    : AdamW(params, config, 0, params.numel()) {}

AdamW::AdamW(model::ParamStore& params, AdamWConfig config, int64_t lo, int64_t hi)
    : params_(&params),
      config_(config),
      lo_(lo),
      hi_(hi),
      m_(Tensor::zeros({hi - lo}, DType::kF32, mem::Category::kOptimizer)),
      v_(Tensor::zeros({hi - lo}, DType::kF32, mem::Category::kOptimizer)) {
  // (Padding beyond the last parameter is in no segment: never updated.)
  params_->for_each_in_range(lo_, hi_, [&](const model::Param& prm, int64_t a, int64_t b) {
    segments_.push_back({a - lo_, b - a, prm.spec.weight_decay ? config_.weight_decay : 0.f});
  });
}

void AdamW::write_bf16_copies() {
  size_t k = 0;  // segments_ holds the pieces in for_each_in_range's order
  params_->for_each_in_range(lo_, hi_, [&](const model::Param& prm, int64_t a, int64_t) {
    kernels::AdamwSegment& s = segments_.at(k++);
    if (prm.bf16_offset_elems >= 0 && prm.value_bf16.defined())
      s.bf16_out = prm.value_bf16.bf16p() + (a - prm.offset_elems);
  });
}

void AdamW::step(float lr) {
  step(lr, params_->flat_values().f32() + lo_, params_->flat_grads().f32() + lo_);
}

void AdamW::step(float lr, float* values, const float* grads, float grad_scale) {
  profile::Scope p("optimizer");
  ++t_;
  kernels::adamw_update_multi(values, grads, m_.f32(), v_.f32(), segments_.data(),
                              static_cast<int64_t>(segments_.size()), lr, config_.beta1,
                              config_.beta2, config_.eps, t_, grad_scale);
}

float lr_at(int64_t step, int64_t warmup_steps, int64_t total_steps, float lr_max,
            float min_ratio) {
  if (step < warmup_steps)
    return lr_max * static_cast<float>(step + 1) / static_cast<float>(warmup_steps);
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

// AdamW with fp32 state, the learning-rate schedule, and global-norm gradient clipping.
#pragma once

#include <cstdint>

#include "model/params.h"

namespace mt::train {

struct AdamWConfig {
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;  // applied to matrices only (ParamSpec::weight_decay)
};

class AdamW {
 public:
  AdamW(model::ParamStore& params, AdamWConfig config);
  // One update of every parameter with learning rate lr; the step count t starts at 1.
  void step(float lr);
  int64_t steps_taken() const { return t_; }
  model::ParamStore& params() { return *params_; }
  Tensor& m() { return m_; }
  Tensor& v() { return v_; }

 private:
  model::ParamStore* params_;
  AdamWConfig config_;
  Tensor m_, v_;  // first and second moments, flat like the parameters
  int64_t t_ = 0;
};

// Linear warmup to lr_max over warmup steps, then cosine decay to min_ratio * lr_max at
// total_steps. step counts from 0.
float lr_at(int64_t step, int64_t warmup_steps, int64_t total_steps, float lr_max,
            float min_ratio);

// The global L2 norm of all gradients (summed in double, in parameter order).
double grad_norm(model::ParamStore& params);
// Scales gradients so their global norm is at most max_norm; returns the norm before.
double clip_grad_norm(model::ParamStore& params, double max_norm);

}  // namespace mt::train

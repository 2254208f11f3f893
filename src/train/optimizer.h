// AdamW with fp32 state, the learning-rate schedule, and global-norm gradient clipping.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/kernels.h"
#include "model/params.h"

namespace mt::train {

struct AdamWConfig {
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;  // applied to matrices only (ParamSpec::weight_decay)
};

// AdamW over elements [lo, hi) of the flat parameter buffer: all of it (one rank, DDP) or
// one rank's ZeRO shard, which may begin and end inside parameters; weight decay is chosen
// per parameter for each piece. The moments cover exactly [lo, hi).
class AdamW {
 public:
  AdamW(model::ParamStore& params, AdamWConfig config);  // every element
  AdamW(model::ParamStore& params, AdamWConfig config, int64_t lo, int64_t hi);
  // One update of every parameter with learning rate lr; the step count t starts at 1.
  void step(float lr);
  // The same on explicit buffers: values and grads point at flat element lo. grad_scale
  // multiplies each gradient as the update reads it (global-norm clipping, in the same pass).
  void step(float lr, float* values, const float* grads, float grad_scale = 1.0f);
  int64_t steps_taken() const { return t_; }
  // From now on each step also writes the bf16 working copy of the GEMM weights it updates
  // (their ParamStore views, bound now and not rebound later), in the update's pass: the
  // copy the store's refresh_bf16 would make afterwards, bit for bit, without reading the
  // values again. For an optimizer over the whole store (no ZeRO sharding).
  void write_bf16_copies();
  void set_steps_taken(int64_t t) { t_ = t; }  // resuming from a checkpoint
  model::ParamStore& params() { return *params_; }
  Tensor& m() { return m_; }
  Tensor& v() { return v_; }

 private:
  model::ParamStore* params_;
  AdamWConfig config_;
  int64_t lo_ = 0, hi_ = 0;
  Tensor m_, v_;  // first and second moments of elements [lo, hi)
  int64_t t_ = 0;
  // The pieces of [lo, hi) by parameter, each with its weight decay (one kernel call).
  std::vector<kernels::AdamwSegment> segments_;
};

// Linear warmup to lr_max over warmup steps, then cosine decay to min_ratio * lr_max at
// total_steps. step counts from 0.
float lr_at(int64_t step, int64_t warmup_steps, int64_t total_steps, float lr_max, float min_ratio);

// The global L2 norm of all gradients (summed in double, in parameter order).
double grad_norm(model::ParamStore& params);
// Scales gradients so their global norm is at most max_norm; returns the norm before.
double clip_grad_norm(model::ParamStore& params, double max_norm);

}  // namespace mt::train

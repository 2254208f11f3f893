// The base of every test training run: the `tiny` preset on `data`, one kernel thread per
// rank, no progress output, a fixed peak (MFU is not under test; measuring the peak would
// cost seconds). Callers set the shape and layout they test on top.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "train/trainer.h"

namespace mt::test {

inline train::TrainOptions tiny_run(const std::string& data, int64_t steps, int64_t seq_len,
                                    int64_t batch) {
  train::TrainOptions o;
  o.model = model::preset("tiny");
  o.model.seq_len = seq_len;
  o.batch = batch;
  o.steps = steps;
  o.data = data;
  o.threads = 1;
  o.quiet = true;
  o.peak_flops = 1e11;
  return o;
}

// Two runs that must be the same to the bit: every step's loss and gradient norm, the final
// parameters (keep_final_params) and the validation losses.
inline void expect_bitwise_same(const train::TrainResult& a, const train::TrainResult& b,
                                const std::string& what) {
  ASSERT_EQ(a.steps.size(), b.steps.size()) << what;
  for (size_t i = 0; i < a.steps.size(); ++i) {
    EXPECT_EQ(a.steps[i].loss, b.steps[i].loss) << what << " step " << i + 1;
    EXPECT_EQ(a.steps[i].grad_norm, b.steps[i].grad_norm) << what << " step " << i + 1;
  }
  EXPECT_EQ(a.final_params, b.final_params) << what;
  EXPECT_EQ(a.val_losses, b.val_losses) << what;
}

}  // namespace mt::test

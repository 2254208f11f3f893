// The base of every test training run: the `tiny` preset on `data`, one kernel thread per
// rank, no progress output, a fixed peak (MFU is not under test; measuring the peak would
// cost seconds). Callers set the shape and layout they test on top.
#pragma once

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

}  // namespace mt::test

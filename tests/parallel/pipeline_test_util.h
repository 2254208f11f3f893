// Shared by the pipeline tests: a small model (8 layers so that pp 4 x v 2 chunks fit,
// d_model 64, seq 32, batch 16) on the demo text; runs in well under a second per layout.
#pragma once

#include <string>

#include "test_util.h"
#include "tiny_run.h"
#include "train/trainer.h"

namespace mt::test {

inline const std::string& pp_demo_data() {
  static const std::string path = demo_tokens(scratch_dir("pp"));
  return path;
}

inline train::TrainOptions pp_options(int pp, int m, const std::string& schedule, int v,
                                      int64_t steps) {
  train::TrainOptions o = tiny_run(pp_demo_data(), steps, 32, 16);
  o.model.n_layer = 8;
  o.model.d_model = 64;
  o.model.n_head = 2;
  o.model.d_ff = 256;
  o.backend = "local";
  o.pipeline.pp = pp;
  o.pipeline.microbatches = m;
  o.pipeline.schedule = schedule;
  o.pipeline.virtual_stages = v;
  return o;
}

}  // namespace mt::test

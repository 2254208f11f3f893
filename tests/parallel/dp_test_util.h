// Shared by the data-parallel tests: a small `tiny` (2 layers, seq 32, batch 8: the whole
// suite runs in minutes on 2 cores) trained on the demo text.
#pragma once

#include <cmath>
#include <string>

#include "test_util.h"
#include "tiny_run.h"
#include "train/trainer.h"

namespace mt::test {

inline const std::string& dp_demo_data() {
  static const std::string path = demo_tokens(scratch_dir("dp"));
  return path;
}

inline train::TrainOptions dp_options(int dp, int zero, int64_t steps) {
  train::TrainOptions o = tiny_run(dp_demo_data(), steps, 32, 8);
  o.model.n_layer = 2;
  o.dp = dp;
  o.zero = zero;
  o.bucket_mb = 0.25;  // 64 Ki elements: about 7 buckets, so bucketing is exercised
  o.keep_final_params = true;
  o.backend = "local";
  return o;
}

// Largest |a[i] - b[i]|: infinity where the sizes differ (or both are empty: nothing was
// compared), NaN where a difference is NaN, so that `EXPECT_LT(max_abs_diff(..), tol)` fails.
inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size() || a.empty()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::abs(static_cast<double>(a[i]) - b[i]);
    if (std::isnan(d)) return d;
    m = std::max(m, d);
  }
  return m;
}

}  // namespace mt::test

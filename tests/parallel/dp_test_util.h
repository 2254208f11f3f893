// Shared by the data-parallel tests: a small `tiny` (2 layers, seq 32, batch 8: the whole
// suite runs in minutes on 2 cores) trained on the demo text.
#pragma once

#include <cmath>
#include <string>

#include "model/params.h"
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

// Ψp: the parameter count padded to a multiple of the dp size (the flat layout's shards are
// equal), from the config alone (not from the code under test).
inline int64_t padded_param_elems(const model::GptConfig& c, int dp) {
  const int64_t psi = model::count_params(model::gpt_param_specs(c));
  return (psi + dp - 1) / dp * dp;
}

// The ZeRO-2/3 unit pool (docs/data_parallel.md), from the config alone: slot 0 the
// embeddings (wte, wpe), slot 1 the head (ln_f + the padding), two block slots; elements.
inline int64_t zero_pool_elems(const model::GptConfig& c, int dp) {
  const int64_t C = c.d_model, F = c.d_ff;
  const int64_t embed = c.padded_vocab() * C + c.seq_len * C;
  const int64_t block =
      2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (F * C + F) + (C * F + C);
  const int64_t pad = padded_param_elems(c, dp) - model::count_params(model::gpt_param_specs(c));
  return embed + (2 * C + pad) + 2 * block;
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

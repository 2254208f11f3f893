// Shared by the tensor-parallel tests: the data-parallel tests' small `tiny` (2 layers,
// seq 32, batch 8) with --tp / --sp, a 12-head variant for tp = 3, and the comparison of a
// rank's parameter shards with the matching slices of the single-rank parameters.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "dp_test_util.h"
#include "model/params.h"

namespace mt::test {

inline train::TrainOptions tp_options(int dp, int tp, bool sp, int64_t steps) {
  train::TrainOptions o = dp_options(dp, 0, steps);
  o.tp = tp;
  o.sp = sp;
  return o;
}

// 12 heads of 8 (d_model 96), d_ff 384 and seq 24: divisible by 3 (and 2, 4).
inline train::TrainOptions tp12_options(int dp, int tp, bool sp, int64_t steps) {
  train::TrainOptions o = tp_options(dp, tp, sp, steps);
  o.model.n_head = 12;
  o.model.d_model = 96;
  o.model.d_ff = 384;
  o.model.seq_len = 24;
  return o;
}

// Largest |difference| between every parameter shard of every rank of `r` (a run with
// tp ranks) and the matching slice of the single-rank parameters `ref`. Vocabulary rows
// that the tp run pads beyond the single rank's padding must be zero.
inline double max_shard_diff(const train::TrainResult& r, const train::TrainOptions& o,
                             const std::vector<float>& ref) {
  const auto ref_specs = model::gpt_param_specs(o.model);
  model::GptConfig tc = o.model;
  if (o.tp > 1) tc.vocab_pad_multiple = model::tp_vocab_pad(o.tp);
  double worst = 0;
  for (const auto& rank : r.ranks) {
    const int t = rank.rank % o.tp;
    const auto specs = model::tp_shard_specs(model::gpt_param_specs(tc), t, o.tp);
    if (rank.final_params.empty() || specs.size() != ref_specs.size()) return INFINITY;
    int64_t ref_off = 0, off = 0;
    for (size_t i = 0; i < specs.size(); ++i) {
      const auto& s = specs[i];
      // Sizes first: a shorter rank or reference would compare less than it claims.
      if (ref_off + shape_numel(ref_specs[i].shape) > static_cast<int64_t>(ref.size()) ||
          off + shape_numel(s.shape) > static_cast<int64_t>(rank.final_params.size()))
        return INFINITY;
      // The single-rank tensor, grown with zero rows to the tp run's padded vocabulary.
      std::vector<float> whole(static_cast<size_t>(shape_numel(s.global_shape)), 0.f);
      const int64_t ref_n = shape_numel(ref_specs[i].shape);
      std::copy(ref.begin() + ref_off, ref.begin() + ref_off + ref_n, whole.begin());
      std::vector<float> slice(static_cast<size_t>(shape_numel(s.shape)));
      model::tp_slice(s, whole.data(), slice.data());
      for (size_t k = 0; k < slice.size(); ++k)
        worst = std::max(worst, std::abs(static_cast<double>(slice[k]) -
                                         rank.final_params[static_cast<size_t>(off) + k]));
      ref_off += ref_n;
      off += static_cast<int64_t>(slice.size());
    }
    if (ref_off != static_cast<int64_t>(ref.size()) ||
        off != static_cast<int64_t>(rank.final_params.size()))
      return INFINITY;  // elements left over: compared less than the whole
  }
  return worst;
}

}  // namespace mt::test

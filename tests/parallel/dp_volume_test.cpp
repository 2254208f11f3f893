// Volume: the flight recorder's bytes per rank per step over the dp group equal the ZeRO
// paper's counts (Rajbhandari et al. 2020, section 7): 2(N-1)/N·Ψ·4 bytes for DDP, ZeRO-1
// and ZeRO-2 (reduce-scatter + all-gather, or the all-reduce that is both), 3(N-1)/N·Ψ·4
// for ZeRO-3 (parameters gathered for forward and again for backward). Exactly, with Ψ
// padded to Ψp, the next multiple of N (fewer than N zero elements; docs/data_parallel.md).
#include <gtest/gtest.h>

#include "dp_test_util.h"
#include "model/params.h"

namespace mt::train {
namespace {

TrainOptions odd_model(int dp, int zero) {
  TrainOptions o = test::dp_options(dp, zero, 3);
  // d_model 98, 3 layers: Ψ = 377,986 = 2 · 188,993, so N = 4 and 8 need padding.
  o.model.d_model = 98;
  o.model.n_head = 2;
  o.model.d_ff = 4 * 98;
  o.model.n_layer = 3;
  return o;
}

class DpVolume : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(DpVolume, BytesPerRankPerStepEqualTheFormula) {
  const auto [N, stage] = GetParam();
  const TrainOptions o = odd_model(N, stage);
  const int64_t psi = model::count_params(model::gpt_param_specs(o.model));
  ASSERT_EQ(psi, 377986);
  const TrainResult r = run_training(o);
  const int64_t P = (psi + N - 1) / N * N;
  EXPECT_EQ(r.padded_params, P);
  const int64_t expect = (stage == 3 ? 3 : 2) * (N - 1) * (P / N) * 4;
  for (const RankRecord& rk : r.ranks)
    for (size_t s = 0; s < 2; ++s) {  // steps 1 and 2 (step 3 ends with validation)
      EXPECT_EQ(rk.step_recv_bytes[s], expect) << "rank " << rk.rank << " step " << s + 1;
      EXPECT_EQ(rk.step_sent_bytes[s], expect) << "rank " << rk.rank << " step " << s + 1;
    }
  EXPECT_EQ(r.steps[0].comm_bytes, expect);
}

INSTANTIATE_TEST_SUITE_P(Stages, DpVolume,
                         ::testing::Combine(::testing::Values(2, 4, 8),
                                            ::testing::Values(0, 1, 2, 3)),
                         [](const auto& info) {
                           return "dp" + std::to_string(std::get<0>(info.param)) + "_zero" +
                                  std::to_string(std::get<1>(info.param));
                         });

// Accumulation over k microbatches: DDP and ZeRO-1 still reduce once per step; ZeRO-2 and
// ZeRO-3 reduce-scatter every microbatch (ZeRO-3 also gathers twice per microbatch).
TEST(DpVolumeAccumulation, OncePerStepForStages0And1) {
  const int N = 2, k = 2;
  for (int stage = 0; stage <= 3; ++stage) {
    TrainOptions o = odd_model(N, stage);
    o.microbatch = o.batch / N / k;
    const TrainResult r = run_training(o);
    const int64_t S = r.padded_params / N, unit = (N - 1) * S * 4;
    const int64_t expect = stage <= 1 ? 2 * unit : stage == 2 ? (k + 1) * unit : 3 * k * unit;
    for (const RankRecord& rk : r.ranks)
      EXPECT_EQ(rk.step_recv_bytes[0], expect) << "stage " << stage;
  }
}

}  // namespace
}  // namespace mt::train

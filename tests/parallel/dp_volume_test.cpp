// Volume: the flight recorder's bytes per rank per step over the dp group equal the ZeRO
// paper's counts (Rajbhandari et al. 2020, section 7): 2(N-1)/N·Ψ·4 bytes for DDP, ZeRO-1
// and ZeRO-2 (reduce-scatter + all-gather, or the all-reduce that is both), 3(N-1)/N·Ψ·4
// for ZeRO-3 (parameters gathered for forward and again for backward). Exactly, with Ψ
// padded to Ψp, the next multiple of N (fewer than N zero elements; docs/data_parallel.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <utility>
#include <vector>

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

// ZeRO-3 with --dtype bf16 (docs/mixed_precision.md, "ZeRO-3"): the blocks' GEMM weights
// (R elements, nothing reads them in f32) are gathered in bf16, everything else in f32, and
// the gradients reduce-scattered in f32 as before. A rank receives, per gather of the whole
// model (two a step), 2 bytes for each element of R outside its shard and 4 for each other
// element outside it; it sends its own part to the N - 1 others.
TEST(DpVolumeBf16, Zero3GathersTheGemmWeightsInBf16) {
  for (int N : {2, 4}) {
    SCOPED_TRACE("dp " + std::to_string(N));
    TrainOptions o = odd_model(N, 3);
    o.dtype = "bf16";
    const std::vector<model::ParamSpec> specs = model::gpt_param_specs(o.model);
    std::vector<std::pair<int64_t, int64_t>> gemm;  // the blocks' GEMM weights, flat ranges
    int64_t off = 0, R = 0;
    for (const model::ParamSpec& p : specs) {
      const int64_t n = shape_numel(p.shape);
      if (p.gemm_weight && p.layer >= 0) gemm.emplace_back(off, off + n), R += n;
      off += n;
    }
    ASSERT_EQ(R, 3 * 12 * 98 * 98) << "c_attn, attn c_proj, c_fc, mlp c_proj of 3 blocks";
    const TrainResult r = run_training(o);
    const int64_t P = r.padded_params, S = P / N;
    int64_t all_sent = 0, all_recv = 0;
    for (const RankRecord& rk : r.ranks) {
      int64_t mine_r = 0;  // this rank's shard's elements of R
      for (const auto& [a, b] : gemm)
        mine_r += std::max<int64_t>(0, std::min(b, (rk.rank + 1) * S) - std::max(a, rk.rank * S));
      const int64_t gather_recv = 2 * (R - mine_r) + 4 * ((P - R) - (S - mine_r));
      const int64_t gather_sent = (N - 1) * (2 * mine_r + 4 * (S - mine_r));
      const int64_t rs = (N - 1) * S * 4;
      EXPECT_EQ(rk.step_recv_bytes[0], 2 * gather_recv + rs) << "rank " << rk.rank;
      EXPECT_EQ(rk.step_sent_bytes[0], 2 * gather_sent + rs) << "rank " << rk.rank;
      all_sent += rk.step_sent_bytes[0];
      all_recv += rk.step_recv_bytes[0];
    }
    EXPECT_EQ(all_sent, all_recv);
    // Against f32 gathers (3(N-1)/N·Ψp·4 a rank): R's share of two of the three passes halved.
    EXPECT_EQ(all_recv, N * 3 * (N - 1) * S * 4 - 2 * (N - 1) * R * 2);
  }
}

}  // namespace
}  // namespace mt::train

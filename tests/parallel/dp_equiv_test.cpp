// Equivalence: every DP size and ZeRO stage trains the same model as the single-rank run
// (DESIGN.md, idea 2), with the same global batch.
#include <gtest/gtest.h>

#include <cmath>

#include "dp_test_util.h"

namespace mt::train {
namespace {

// Tolerances. The layouts differ from the single rank only in the order of f32 sums: a
// rank's weight gradient sums B/D samples, the reduction adds D partial sums, and the
// loss / squared norm are added per rank (f32 relative rounding 6e-8 per add, ~1e-6 over
// a sum). Adam divides by sqrt(v), so elements with tiny gradients turn such differences
// into relative update differences of up to ~1e-3 of lr; over 20 steps at lr 1e-3 that
// bounds parameter differences by ~2e-5 (measured: below 5e-6), and the loss, a smooth
// function of the parameters, moves by ~1e-5 (measured: below 1e-6).
constexpr double kLossTol = 5e-5;
constexpr double kParamTol = 5e-5;
constexpr int64_t kSteps = 20;

class DpEquiv : public ::testing::TestWithParam<std::tuple<int, int>> {
 protected:
  static const TrainResult& oracle() {
    static const TrainResult r = run_training(test::dp_options(1, 0, kSteps));
    return r;
  }
};

TEST_P(DpEquiv, LossesAndParamsMatchTheSingleRank) {
  const auto [dp, zero] = GetParam();
  const TrainResult& ref = oracle();
  const TrainResult r = run_training(test::dp_options(dp, zero, kSteps));
  ASSERT_EQ(r.steps.size(), ref.steps.size());
  double worst = 0;
  for (size_t i = 0; i < r.steps.size(); ++i) {
    EXPECT_NEAR(r.steps[i].loss, ref.steps[i].loss, kLossTol) << "step " << i + 1;
    EXPECT_NEAR(r.steps[i].grad_norm, ref.steps[i].grad_norm, 1e-4 * ref.steps[i].grad_norm)
        << "step " << i + 1;
    worst = std::max(worst, std::abs(static_cast<double>(r.steps[i].loss) - ref.steps[i].loss));
  }
  ASSERT_EQ(r.final_params.size(), ref.final_params.size());
  const double pd = test::max_abs_diff(r.final_params, ref.final_params);
  EXPECT_LT(pd, kParamTol);
  ASSERT_FALSE(r.val_losses.empty());
  EXPECT_NEAR(r.val_losses.back().second, ref.val_losses.back().second, kLossTol);
  std::printf("dp %d zero %d: max |loss diff| %.2e, max |param diff| %.2e\n", dp, zero, worst, pd);
}

INSTANTIATE_TEST_SUITE_P(Layouts, DpEquiv,
                         ::testing::Combine(::testing::Values(2, 4, 8),
                                            ::testing::Values(0, 1, 2, 3)),
                         [](const auto& info) {
                           return "dp" + std::to_string(std::get<0>(info.param)) + "_zero" +
                                  std::to_string(std::get<1>(info.param));
                         });

// Gradient accumulation (2 microbatches per rank): ZeRO-0/1 reduce once per step, ZeRO-2/3
// every microbatch; both equal the single rank that accumulates 4 microbatches of 2.
TEST(DpEquivAccumulation, TwoMicrobatchesPerRankMatchTheSingleRank) {
  TrainOptions single = test::dp_options(1, 0, 6);
  single.microbatch = 2;
  const TrainResult ref = run_training(single);
  for (int zero = 0; zero <= 3; ++zero) {
    TrainOptions o = test::dp_options(2, zero, 6);
    o.microbatch = 2;
    const TrainResult r = run_training(o);
    ASSERT_EQ(r.steps.size(), 6u);  // sizes first: every step compared
    ASSERT_EQ(ref.steps.size(), r.steps.size());
    for (size_t i = 0; i < r.steps.size(); ++i)
      EXPECT_NEAR(r.steps[i].loss, ref.steps[i].loss, kLossTol)
          << "zero " << zero << " step " << i + 1;
    EXPECT_LT(test::max_abs_diff(r.final_params, ref.final_params), kParamTol) << "zero " << zero;
  }
}

// Same seed, layout and backend: bitwise the same (the local backend reduces in rank order).
TEST(DpDeterminism, SameLayoutTwiceIsBitwiseTheSame) {
  for (int zero : {0, 3}) {
    const TrainResult a = run_training(test::dp_options(4, zero, 5));
    const TrainResult b = run_training(test::dp_options(4, zero, 5));
    ASSERT_EQ(a.steps.size(), 5u);
    ASSERT_EQ(b.steps.size(), a.steps.size());
    ASSERT_FALSE(a.final_params.empty());
    for (size_t i = 0; i < a.steps.size(); ++i) {
      EXPECT_EQ(a.steps[i].loss, b.steps[i].loss) << "zero " << zero << " step " << i + 1;
      EXPECT_EQ(a.steps[i].grad_norm, b.steps[i].grad_norm);
    }
    EXPECT_EQ(a.final_params, b.final_params) << "zero " << zero;
  }
}

}  // namespace
}  // namespace mt::train

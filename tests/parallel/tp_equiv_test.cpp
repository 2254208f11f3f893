// Equivalence: tensor parallelism (tp 2, 3, 4; with and without sequence parallelism; and
// dp 2 x tp 2 under ZeRO) trains the same model as the single rank: the loss at every
// step, and every parameter shard against the matching slice of the single-rank weights.
#include <gtest/gtest.h>

#include <cmath>

#include "tp_test_util.h"

namespace mt::train {
namespace {

// Tolerances. TP changes only the order of f32 sums: a row-parallel layer adds t partial
// products of C/t (or F/t) terms, the vocabulary-parallel softmax adds t partial sums of
// exp, and with --sp replicated gradients are t partial sums over the sequence. As for
// data parallelism (dp_equiv_test.cpp) these ~1e-7 relative differences are amplified by
// Adam on elements with tiny gradients to ~1e-5 in the parameters after 20 steps at lr
// 1e-3, and the loss moves by less (measured: see the printed values, below 1e-5).
constexpr double kLossTol = 5e-5;
constexpr double kParamTol = 5e-5;
constexpr int64_t kSteps = 20;

struct Layout {
  int dp, tp;
  bool sp;
  int zero;
  bool heads12;
};

std::string name_of(const Layout& l) {
  return "dp" + std::to_string(l.dp) + "_tp" + std::to_string(l.tp) + (l.sp ? "_sp" : "") +
         "_zero" + std::to_string(l.zero) + (l.heads12 ? "_12heads" : "");
}

TrainOptions options_of(const Layout& l) {
  TrainOptions o = l.heads12 ? test::tp12_options(l.dp, l.tp, l.sp, kSteps)
                             : test::tp_options(l.dp, l.tp, l.sp, kSteps);
  o.zero = l.zero;
  return o;
}

const TrainResult& oracle(bool heads12) {
  static const TrainResult four = run_training(test::tp_options(1, 1, false, kSteps));
  static const TrainResult twelve = run_training(test::tp12_options(1, 1, false, kSteps));
  return heads12 ? twelve : four;
}

class TpEquiv : public ::testing::TestWithParam<Layout> {};

TEST_P(TpEquiv, LossesAndShardsMatchTheSingleRank) {
  const Layout l = GetParam();
  const TrainResult& ref = oracle(l.heads12);
  const TrainOptions o = options_of(l);
  const TrainResult r = run_training(o);
  ASSERT_EQ(r.steps.size(), ref.steps.size());
  double worst = 0;
  for (size_t i = 0; i < r.steps.size(); ++i) {
    EXPECT_NEAR(r.steps[i].loss, ref.steps[i].loss, kLossTol) << "step " << i + 1;
    EXPECT_NEAR(r.steps[i].grad_norm, ref.steps[i].grad_norm, 1e-4 * ref.steps[i].grad_norm)
        << "step " << i + 1;
    worst = std::max(worst, std::abs(static_cast<double>(r.steps[i].loss) - ref.steps[i].loss));
  }
  ASSERT_EQ(r.ranks.size(), static_cast<size_t>(l.dp * l.tp));
  EXPECT_EQ(r.allocations_after_first_step, 0) << "the steady-state step allocates nothing";
  const double pd = test::max_shard_diff(r, o, ref.final_params);
  EXPECT_LT(pd, kParamTol);
  ASSERT_FALSE(r.val_losses.empty());
  EXPECT_NEAR(r.val_losses.back().second, ref.val_losses.back().second, kLossTol);
  std::printf("%s: max |loss diff| %.2e, max |param diff| %.2e\n", name_of(l).c_str(), worst, pd);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, TpEquiv,
    ::testing::Values(Layout{1, 2, false, 0, false}, Layout{1, 2, true, 0, false},
                      Layout{1, 4, false, 0, false}, Layout{1, 4, true, 0, false},
                      Layout{1, 3, false, 0, true}, Layout{1, 3, true, 0, true},
                      Layout{2, 2, false, 0, false}, Layout{2, 2, true, 1, false},
                      Layout{2, 2, true, 3, false}),
    [](const auto& info) { return name_of(info.param); });

// Same seed, layout and backend: bitwise the same losses (the local backend reduces in
// rank order).
TEST(TpDeterminism, SameLayoutTwiceIsBitwiseTheSame) {
  const TrainResult a = run_training(test::tp_options(1, 2, true, 4));
  const TrainResult b = run_training(test::tp_options(1, 2, true, 4));
  ASSERT_EQ(a.steps.size(), 4u);
  ASSERT_EQ(b.steps.size(), a.steps.size());
  ASSERT_FALSE(a.ranks[1].final_params.empty());
  for (size_t i = 0; i < a.steps.size(); ++i) EXPECT_EQ(a.steps[i].loss, b.steps[i].loss);
  EXPECT_EQ(a.ranks[1].final_params, b.ranks[1].final_params);
}

}  // namespace
}  // namespace mt::train

// Equivalence of composed layouts (dp x tp x pp, each ZeRO stage, every schedule) with the
// single rank: the loss and gradient norm at every one of 20 steps, the validation loss,
// and every exported weight. All on the `local` backend (the mpirun twin is
// parallel3d_mpi_test.cpp).
#include <gtest/gtest.h>

#include <cmath>

#include "parallel3d_test_util.h"

namespace mt::train {
namespace {

// Tolerances. A layout changes only the order of f32 sums (dp: gradient reductions; tp:
// partial products and the vocabulary-parallel softmax; pp: the tied embedding's two
// halves, the loss over microbatches). These ~1e-7 relative differences, amplified by
// Adam on elements with tiny gradients over 20 steps at lr 1e-3, stay below 1e-5 in the
// weights and the loss (the test prints the measured values).
constexpr double kLossTol = 5e-5;
constexpr double kNormRelTol = 1e-4;
constexpr double kParamTol = 5e-5;
constexpr int64_t kSteps = 20;

struct Oracle {
  TrainResult result;
  std::string weights;
};

const Oracle& oracle() {
  static const Oracle o = [] {
    TrainOptions opts = test::options3d({}, kSteps);
    Oracle r;
    r.weights = (test::dir3d() / "oracle.safetensors").string();
    opts.export_path = r.weights;
    r.result = run_training(opts);
    return r;
  }();
  return o;
}

class Equiv3d : public ::testing::TestWithParam<test::Layout3d> {};

TEST_P(Equiv3d, MatchesTheSingleRank) {
  const test::Layout3d l = GetParam();
  const Oracle& ref = oracle();
  TrainOptions o = test::options3d(l, kSteps);
  o.export_path = (test::dir3d() / (test::name_of(l) + ".safetensors")).string();
  const TrainResult r = run_training(o);
  ASSERT_EQ(r.steps.size(), ref.result.steps.size());
  double worst = 0;
  for (size_t i = 0; i < r.steps.size(); ++i) {
    const StepRecord &a = r.steps[i], &b = ref.result.steps[i];
    EXPECT_NEAR(a.loss, b.loss, kLossTol) << "step " << i + 1;
    EXPECT_NEAR(a.grad_norm, b.grad_norm, kNormRelTol * b.grad_norm) << "step " << i + 1;
    worst = std::max(worst, std::abs(static_cast<double>(a.loss) - b.loss));
  }
  ASSERT_EQ(r.ranks.size(), static_cast<size_t>(l.dp * l.tp * l.pp));
  EXPECT_EQ(r.allocations_after_first_step, 0) << "the steady-state step allocates nothing";
  ASSERT_FALSE(r.val_losses.empty());
  EXPECT_NEAR(r.val_losses.back().second, ref.result.val_losses.back().second, kLossTol);
  std::string where;
  const double pd = test::max_weight_diff(o.export_path, ref.weights, &where);
  EXPECT_LT(pd, kParamTol) << "in " << where;
  std::printf("%s: max |loss diff| %.2e, max |weight diff| %.2e (%s)\n", test::name_of(l).c_str(),
              worst, pd, where.c_str());
}

using L = test::Layout3d;
INSTANTIATE_TEST_SUITE_P(Layouts, Equiv3d,
                         ::testing::Values(L{2, 2, 2, 0}, L{2, 2, 2, 1}, L{2, 2, 2, 2},
                                           L{2, 2, 2, 3}, L{2, 2, 2, 0, "interleaved", 2},
                                           L{2, 2, 2, 1, "zb1"}, L{2, 2, 2, 3, "zb1", 1, true},
                                           L{2, 2, 2, 3, "gpipe", 1, true}, L{1, 2, 4, 0},
                                           L{4, 1, 2, 0}, L{4, 1, 2, 3, "interleaved", 2},
                                           L{2, 4, 1, 0}, L{2, 3, 2, 1},
                                           L{2, 3, 2, 0, "1f1b", 1, true}),
                         [](const auto& info) { return test::name_of(info.param); });

}  // namespace
}  // namespace mt::train

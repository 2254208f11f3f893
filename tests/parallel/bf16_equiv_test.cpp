// --dtype bf16 on composed layouts against the bf16 single rank (docs/mixed_precision.md):
// the loss and gradient norm at every step and the exported weights.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "parallel3d_test_util.h"

namespace mt::train {
namespace {

// Tolerances. In bf16 a layout changes more than the order of f32 sums: a tp rank rounds
// its own partial product (row-parallel) before the reduction, and a changed f32 sum
// rounds to a different bf16 GEMM input one time in 2^8 per element instead of 2^24.
// Measured over 10 steps (printed below; docs/mixed_precision.md): loss within 5.2e-5,
// grad norm within 9.6e-5 relative (tp, the worst); the tolerances are 10x that. Weights:
// up to 2.0e-3 (tp: an element of attn c_proj whose tiny gradient changed sign, which Adam
// turns into a full lr-sized step); Adam moves a weight by at most about lr = 1e-3 a step,
// so 10 steps bound any element's drift by 1e-2.
constexpr double kLossTol = 5e-4;
constexpr double kNormRelTol = 1e-3;
constexpr double kParamTol = 1e-2;
constexpr int64_t kSteps = 10;

TrainOptions bf16_options(const test::Layout3d& l) {
  TrainOptions o = test::options3d(l, kSteps);
  o.dtype = "bf16";
  return o;
}

struct Oracle {
  TrainResult result;
  std::string weights;
};

const Oracle& oracle() {
  static const Oracle o = [] {
    TrainOptions opts = bf16_options({});
    Oracle r;
    r.weights = (test::dir3d() / "bf16_oracle.safetensors").string();
    opts.export_path = r.weights;
    r.result = run_training(opts);
    return r;
  }();
  return o;
}

class Bf16Equiv : public ::testing::TestWithParam<test::Layout3d> {};

TEST_P(Bf16Equiv, MatchesTheBf16SingleRank) {
  const test::Layout3d l = GetParam();
  const Oracle& ref = oracle();
  TrainOptions o = bf16_options(l);
  o.export_path = (test::dir3d() / ("bf16_" + test::name_of(l) + ".safetensors")).string();
  const TrainResult r = run_training(o);
  ASSERT_EQ(r.steps.size(), ref.result.steps.size());
  double worst = 0, worst_norm = 0;
  for (size_t i = 0; i < r.steps.size(); ++i) {
    const StepRecord &a = r.steps[i], &b = ref.result.steps[i];
    EXPECT_NEAR(a.loss, b.loss, kLossTol) << "step " << i + 1;
    EXPECT_NEAR(a.grad_norm, b.grad_norm, kNormRelTol * b.grad_norm) << "step " << i + 1;
    worst = std::max(worst, std::abs(static_cast<double>(a.loss) - b.loss));
    worst_norm = std::max(worst_norm, std::abs(a.grad_norm - b.grad_norm) / b.grad_norm);
  }
  EXPECT_EQ(r.allocations_after_first_step, 0) << "the steady-state step allocates nothing";
  std::string where;
  const double dw = test::max_weight_diff(o.export_path, ref.weights, &where);
  EXPECT_LE(dw, kParamTol) << where;
  std::printf("%s bf16: max |loss diff| %.2e, grad norm rel %.2e, max |weight diff| %.2e (%s)\n",
              test::name_of(l).c_str(), worst, worst_norm, dw, where.c_str());
}

test::Layout3d layout(int dp, int tp, int pp, int zero, bool sp = false,
                      const std::string& schedule = "1f1b") {
  test::Layout3d l;
  l.schedule = schedule;
  l.dp = dp;
  l.tp = tp;
  l.pp = pp;
  l.zero = zero;
  l.sp = sp;
  return l;
}

INSTANTIATE_TEST_SUITE_P(Layouts, Bf16Equiv,
                         ::testing::Values(layout(2, 1, 1, 1), layout(2, 1, 1, 3),
                                           layout(1, 2, 1, 0), layout(1, 2, 1, 0, true),
                                           layout(1, 1, 2, 0), layout(1, 2, 2, 0, false, "zb1"),
                                           layout(2, 2, 2, 3)),
                         [](const auto& info) { return test::name_of(info.param); });

}  // namespace
}  // namespace mt::train

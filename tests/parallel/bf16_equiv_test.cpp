// --dtype bf16 on composed layouts against the bf16 single rank (docs/mixed_precision.md):
// the loss and gradient norm at every step and the exported weights.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "parallel3d_test_util.h"
#include "train/verify.h"

namespace mt::train {
namespace {

// Tolerances. In bf16 a layout changes more than the order of f32 sums: a tp rank rounds
// its own partial product (row-parallel) before the reduction, and a changed f32 sum
// rounds to a different bf16 GEMM input one time in 2^8 per element instead of 2^24.
// Measured over 10 steps (printed below; docs/mixed_precision.md): loss within 8.3e-5,
// grad norm within 8.7e-5 relative (tp, the worst); the tolerances are 6-10x that. A real
// divergence is far outside: another seed differs by ~1e-2 in the loss at step 1.
constexpr double kLossTol = 5e-4;
constexpr double kNormRelTol = 1e-3;
// Weights: not an absolute bound (Adam moves an element whose tiny gradient flips sign by a
// full lr either way, so a bound above that, 10 x lr here, passes a layout that never
// updates), but each tensor's change over the run against the oracle's change of it:
// ||W_layout - W_oracle|| / ||W_oracle - W_init||. A tensor never updated scores exactly 1,
// a slice shifted to another rank's place far more (the mutations below print the least). Measured
// worst over the layouts below: 0.017 (tp, attn c_proj; printed); the bound is 6x that and 10x
// below 1, so the smallest defect it guards against (one tensor not updated) fails it.
constexpr double kUpdateRelTol = 0.1;
constexpr int64_t kSteps = 10;

TrainOptions bf16_options(const test::Layout3d& l) {
  TrainOptions o = test::options3d(l, kSteps);
  o.dtype = "bf16";
  return o;
}

struct Oracle {
  TrainResult result;
  std::string weights, init;
};

const Oracle& oracle() {
  static const Oracle o = [] {
    TrainOptions opts = bf16_options({});
    Oracle r;
    r.weights = (test::dir3d() / "bf16_oracle.safetensors").string();
    r.init = (test::dir3d() / "bf16_init.safetensors").string();
    opts.export_path = r.weights;
    r.result = run_training(opts);
    EXPECT_TRUE(export_initial_weights(opts, r.init));
    return r;
  }();
  return o;
}

ParamComparison compare_to_oracle(const SafetensorsFile& layout) {
  const SafetensorsFile init = read_safetensors(oracle().init);
  return compare_params(read_safetensors(oracle().weights), layout, &init);
}

class Bf16Equiv : public ::testing::TestWithParam<test::Layout3d> {};

TEST_P(Bf16Equiv, MatchesTheBf16SingleRank) {
  const test::Layout3d l = GetParam();
  const Oracle& ref = oracle();
  TrainOptions o = bf16_options(l);
  o.export_path = (test::dir3d() / ("bf16_" + test::name_of(l) + ".safetensors")).string();
  const TrainResult r = run_training(o);
  ASSERT_EQ(ref.result.steps.size(), static_cast<size_t>(kSteps));  // sizes first
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
  const ParamComparison p = compare_to_oracle(read_safetensors(o.export_path));
  ASSERT_TRUE(p.update_compared);
  EXPECT_LE(p.update_rel, kUpdateRelTol) << p.update_name;
  std::printf(
      "%s bf16: max |loss diff| %.2e, grad norm rel %.2e, max |weight diff| %.2e (%s), update "
      "diff / update %.3f (%s)\n",
      test::name_of(l).c_str(), worst, worst_norm, p.abs_diff, p.abs_name.c_str(), p.update_rel,
      p.update_name.c_str());
}

// The defects the weight check guards against, introduced into the oracle's own weights: each
// must fail it (and the oracle itself must pass, at exactly 0).
TEST(Bf16EquivMutations, EachGuardedDefectFailsTheWeightCheck) {
  const SafetensorsFile good = read_safetensors(oracle().weights);
  const SafetensorsFile init = read_safetensors(oracle().init);
  ASSERT_EQ(compare_to_oracle(good).update_rel, 0.0);
  // No update at all: every tensor scores 1.
  EXPECT_GT(compare_to_oracle(init).update_rel, kUpdateRelTol) << "a layout that never updates";
  double least_missing = INFINITY, least_shifted = INFINITY;
  for (const auto& [name, arr] : good.arrays) {
    // One tensor not updated (missing from the optimizer, or its gradient lost).
    SafetensorsFile missing = good;
    missing.arrays.at(name).data = init.arrays.at(name).data;
    const ParamComparison m = compare_to_oracle(missing);
    EXPECT_GT(m.update_rel, kUpdateRelTol) << name << " not updated";
    EXPECT_EQ(m.update_name, name);
    least_missing = std::min(least_missing, m.update_rel);
    // A shifted slice: the tensor's halves swapped (two tp ranks' slices in each other's
    // place; a 1-element or constant tensor cannot be shifted).
    if (arr.data.size() < 2) continue;
    SafetensorsFile shifted = good;
    std::vector<float>& d = shifted.arrays.at(name).data;
    std::rotate(d.begin(), d.begin() + static_cast<std::ptrdiff_t>(d.size() / 2), d.end());
    if (d == arr.data) continue;
    const double r = compare_to_oracle(shifted).update_rel;
    EXPECT_GT(r, kUpdateRelTol) << name << " shifted";
    least_shifted = std::min(least_shifted, r);
  }
  std::printf(
      "mutations: least update ratio of a tensor not updated %.3f, of a shifted one %.3f "
      "(bound %.3f)\n",
      least_missing, least_shifted, kUpdateRelTol);
}

// The key part of c_attn.bias has a zero true gradient (softmax is invariant to a per-row
// constant): its update is rounding noise that AdamW scales to ~lr, so the update check
// leaves exactly that slice out. Anything there passes; the query and value slices are
// still checked (each not updated fails).
TEST(Bf16EquivMutations, OnlyTheKeyBiasIsLeftOutOfTheUpdateCheck) {
  const SafetensorsFile good = read_safetensors(oracle().weights);
  const SafetensorsFile init = read_safetensors(oracle().init);
  int biases = 0;
  for (const auto& [name, arr] : good.arrays) {
    if (name.find("attn.c_attn.bias") == std::string::npos) continue;
    ++biases;
    const size_t c = arr.data.size() / 3;
    SafetensorsFile noisy = good;
    for (size_t i = c; i < 2 * c; ++i)
      noisy.arrays.at(name).data[i] += (i % 2 ? 1e-2f : -1e-2f);  // 10x lr, either way
    EXPECT_EQ(compare_to_oracle(noisy).update_rel, 0.0) << name << " key slice";
    for (size_t part : {size_t{0}, size_t{2}}) {  // query, value
      SafetensorsFile stale = good;
      for (size_t i = part * c; i < (part + 1) * c; ++i)
        stale.arrays.at(name).data[i] = init.arrays.at(name).data[i];
      const ParamComparison m = compare_to_oracle(stale);
      EXPECT_GT(m.update_rel, kUpdateRelTol)
          << name << (part ? " value" : " query") << " slice not updated";
      EXPECT_EQ(m.update_name, name);
    }
  }
  EXPECT_GT(biases, 0) << "the test model has fused qkv biases";
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

// A layout against its single-rank oracle, for the model-family equivalence tests
// (llama_equiv_test, moe_equiv_test): the loss and gradient norm at every step, the
// validation loss, every exported weight, and each tensor's update against the oracle's.
// The tolerances are parallel3d_equiv_test's and bf16_equiv_test's (their comments derive
// them).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <string>

#include "parallel3d_test_util.h"
#include "train/verify.h"

namespace mt::test {

struct Precision {
  const char* dtype;
  int64_t steps;
  double loss_tol, norm_rel_tol, param_tol;
  // Each tensor's ||W_layout - W_oracle|| / ||W_oracle - W_init|| (a tensor never updated
  // scores 1); bf16: bf16_equiv_test's bound, which replaces the absolute one there (an
  // absolute bound above Adam's sign-flip steps passes a layout that never updates).
  double update_tol;
};
// f32: parallel3d_equiv_test's (20 steps x lr 1e-3 moves a weight by up to 2e-2, so 5e-5
// absolute also catches a missing update); bf16: bf16_equiv_test's (10 steps).
constexpr Precision kF32{"f32", 20, 5e-5, 1e-4, 5e-5, 0.1};
constexpr Precision kBf16{"bf16", 10, 5e-4, 1e-3, INFINITY, 0.1};

// The options of a run in layout l (the oracle: the default layout).
using MakeOptions = std::function<train::TrainOptions(const Layout3d&)>;

struct EquivOracle {
  train::TrainResult result;
  std::string weights, init;
};

// The oracle of `key` (a model family, precision and options), run once per process.
inline const EquivOracle& equiv_oracle(const std::string& key, const MakeOptions& make) {
  static std::map<std::string, EquivOracle> cache;
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  train::TrainOptions opts = make({});
  EquivOracle r;
  r.weights = (dir3d() / (key + "_oracle.safetensors")).string();
  opts.export_path = r.weights;
  r.result = train::run_training(opts);
  r.init = (dir3d() / (key + "_init.safetensors")).string();
  EXPECT_TRUE(train::export_initial_weights(opts, r.init));
  return cache.emplace(key, std::move(r)).first->second;
}

// `result`: where to keep the layout's run (null: nowhere).
inline void check_equiv(const std::string& key, const Layout3d& l, const Precision& p,
                        const MakeOptions& make, train::TrainResult* result = nullptr) {
  const EquivOracle& ref = equiv_oracle(key, make);
  train::TrainOptions o = make(l);
  o.export_path = (dir3d() / (key + "_" + name_of(l) + ".safetensors")).string();
  const train::TrainResult r = train::run_training(o);
  if (result) *result = r;
  ASSERT_EQ(r.steps.size(), ref.result.steps.size());
  double worst = 0, worst_norm = 0;
  for (size_t i = 0; i < r.steps.size(); ++i) {
    const train::StepRecord &a = r.steps[i], &b = ref.result.steps[i];
    EXPECT_NEAR(a.loss, b.loss, p.loss_tol) << "step " << i + 1;
    EXPECT_NEAR(a.grad_norm, b.grad_norm, p.norm_rel_tol * b.grad_norm) << "step " << i + 1;
    worst = std::max(worst, std::abs(static_cast<double>(a.loss) - b.loss));
    worst_norm = std::max(worst_norm, std::abs(a.grad_norm - b.grad_norm) / b.grad_norm);
  }
  EXPECT_EQ(r.allocations_after_first_step, 0) << "the steady-state step allocates nothing";
  ASSERT_FALSE(r.val_losses.empty());
  EXPECT_NEAR(r.val_losses.back().second, ref.result.val_losses.back().second, p.loss_tol);
  std::string where;
  const double pd = max_weight_diff(o.export_path, ref.weights, &where);
  EXPECT_LT(pd, p.param_tol) << "in " << where;
  const train::SafetensorsFile init = train::read_safetensors(ref.init);
  const train::ParamComparison u = train::compare_params(
      train::read_safetensors(ref.weights), train::read_safetensors(o.export_path), &init);
  EXPECT_LE(u.update_rel, p.update_tol) << u.update_name;
  std::printf(
      "%s %s: max |loss diff| %.2e, grad norm rel %.2e, max |weight diff| %.2e (%s), "
      "update diff / update %.2e (%s)\n",
      key.c_str(), name_of(l).c_str(), worst, worst_norm, pd, where.c_str(), u.update_rel,
      u.update_name.c_str());
}

}  // namespace mt::test

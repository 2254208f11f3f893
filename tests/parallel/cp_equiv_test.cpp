// Context parallelism (docs/context_parallel.md) against the single rank: the loss and
// gradient norm at every one of 20 steps, the validation loss and every exported weight,
// for cp 2 and 4 alone and composed with tp + sp, dp with ZeRO-3 and pp, with the ring, the
// all-gather and the all-to-all (Ulysses) exchange, on GPT-2 (learned
// positions) and on a Llama (rotary positions, grouped-query attention); every pipeline
// schedule (1F1B, interleaved, zero-bubble), recomputation, and bf16 (against the bf16
// single rank). The oracle runs the naive T x T attention kernel; every cp layout runs the
// blockwise one on its pieces.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>

#include "parallel3d_test_util.h"

namespace mt::train {
namespace {

// parallel3d_equiv_test's tolerances (derived there: f32 summation order amplified over 20
// Adam steps). Context parallelism changes the order of the same kind of sums: the
// attention's online softmax over key blocks (against the naive kernel's one pass), the
// gradients of keys and values summed over ranks by the reduce-scatter, the weights'
// gradients summed over dp x cp.
constexpr double kLossTol = 5e-5;
constexpr double kNormRelTol = 1e-4;
constexpr double kParamTol = 5e-5;
constexpr int64_t kSteps = 20;

struct CpLayout {
  test::Layout3d l;
  int cp = 2;
  bool llama = false;
  std::string recompute = "none";
  std::string comm = "ring";
};

std::string name_of(const CpLayout& c) {
  std::string comm = c.comm == "all-gather" ? "allgather" : c.comm;
  return std::string(c.llama ? "llama_" : "gpt_") + "cp" + std::to_string(c.cp) + "_" + comm + "_" +
         test::name_of(c.l) + (c.recompute != "none" ? "_" + c.recompute : "");
}

TrainOptions cp_options(const CpLayout& c) {
  TrainOptions o = test::options3d(c.l, kSteps);
  if (c.llama) test::make_llama3d(o.model);
  o.cp = c.cp;
  o.recompute = c.recompute;
  o.cp_comm = c.comm;
  return o;
}

struct Oracle {
  TrainResult result;
  std::string weights;
};

const Oracle& oracle(bool llama) {
  static std::map<bool, Oracle> cache;
  auto it = cache.find(llama);
  if (it != cache.end()) return it->second;
  CpLayout one;
  one.cp = 1;
  one.llama = llama;
  TrainOptions o = cp_options(one);
  o.attention = "naive";
  Oracle r;
  r.weights =
      (test::dir3d() / (llama ? "cp_oracle_llama.safetensors" : "cp_oracle.safetensors")).string();
  o.export_path = r.weights;
  r.result = run_training(o);
  return cache.emplace(llama, std::move(r)).first->second;
}

class CpEquiv : public ::testing::TestWithParam<CpLayout> {};

TEST_P(CpEquiv, MatchesTheSingleRank) {
  const CpLayout c = GetParam();
  const Oracle& ref = oracle(c.llama);
  TrainOptions o = cp_options(c);
  o.export_path = (test::dir3d() / (name_of(c) + ".safetensors")).string();
  const TrainResult r = run_training(o);
  ASSERT_EQ(r.steps.size(), ref.result.steps.size());
  double worst = 0, worst_norm = 0;
  for (size_t i = 0; i < r.steps.size(); ++i) {
    const StepRecord &a = r.steps[i], &b = ref.result.steps[i];
    EXPECT_NEAR(a.loss, b.loss, kLossTol) << "step " << i + 1;
    EXPECT_NEAR(a.grad_norm, b.grad_norm, kNormRelTol * b.grad_norm) << "step " << i + 1;
    worst = std::max(worst, std::abs(static_cast<double>(a.loss) - b.loss));
    worst_norm = std::max(worst_norm, std::abs(a.grad_norm - b.grad_norm) / b.grad_norm);
    EXPECT_GT(a.cp_bytes, 0) << "step " << i + 1 << ": the attention's exchanges are counted";
  }
  ASSERT_EQ(r.ranks.size(), static_cast<size_t>(c.l.dp * c.l.tp * c.l.pp * c.cp));
  EXPECT_EQ(r.allocations_after_first_step, 0) << "the steady-state step allocates nothing";
  ASSERT_FALSE(r.val_losses.empty());
  EXPECT_NEAR(r.val_losses.back().second, ref.result.val_losses.back().second, kLossTol);
  std::string where;
  const double pd = test::max_weight_diff(o.export_path, ref.weights, &where);
  EXPECT_LT(pd, kParamTol) << "in " << where;
  std::printf("%s: max |loss diff| %.2e, grad norm rel %.2e, max |weight diff| %.2e (%s)\n",
              name_of(c).c_str(), worst, worst_norm, pd, where.c_str());
}

using L = test::Layout3d;
const std::string kAg = "all-gather", kA2a = "a2a";
INSTANTIATE_TEST_SUITE_P(
    Layouts, CpEquiv,
    ::testing::Values(
        // ring (the default)
        CpLayout{L{}, 2}, CpLayout{L{}, 4},
        CpLayout{L{1, 2, 1, 0, "1f1b", 1, true}, 2},  // cp 2 x tp 2 + sp
        CpLayout{L{2, 1, 1, 3}, 2},                   // cp 2 x dp 2, ZeRO-3
        CpLayout{L{1, 1, 2, 0, "1f1b"}, 2},           // cp 2 x pp 2
        CpLayout{L{1, 1, 2, 0, "interleaved", 2}, 2}, CpLayout{L{}, 2, false, "full"},
        CpLayout{L{1, 1, 2, 0, "zb1"}, 2},        // cp 2 x pp 2, zero-bubble (B and W)
        CpLayout{L{1, 2, 2, 0, "zb1"}, 2, true},  // Llama cp 2 x tp 2 x pp 2, zero-bubble
        CpLayout{L{}, 2, true}, CpLayout{L{}, 4, true},
        CpLayout{L{1, 2, 1, 0, "1f1b", 1, true}, 2, true},
        // all-gather
        CpLayout{L{}, 2, false, "none", kAg}, CpLayout{L{}, 4, false, "none", kAg},
        CpLayout{L{1, 2, 1, 0, "1f1b", 1, true}, 2, false, "none", kAg},
        CpLayout{L{2, 1, 1, 3}, 2, false, "none", kAg},
        CpLayout{L{1, 1, 2, 0, "1f1b"}, 2, false, "none", kAg}, CpLayout{L{}, 2, true, "none", kAg},
        CpLayout{L{1, 1, 2, 0, "zb1"}, 2, false, "selective", kAg},
        CpLayout{L{1, 1, 2, 0, "interleaved", 2}, 2, true, "none", kAg},
        CpLayout{L{}, 4, true, "selective", kAg},
        CpLayout{L{1, 2, 1, 0, "1f1b", 1, true}, 2, true, "none", kAg},
        // a2a (Ulysses): 12 heads (GPT) and 8 heads on 4 kv heads (Llama) split over cp
        CpLayout{L{}, 2, false, "none", kA2a}, CpLayout{L{}, 4, false, "none", kA2a},
        CpLayout{L{1, 2, 1, 0, "1f1b", 1, true}, 2, false, "none", kA2a},
        CpLayout{L{2, 1, 1, 3}, 2, false, "none", kA2a},
        CpLayout{L{1, 1, 2, 0, "1f1b"}, 2, false, "selective", kA2a},
        CpLayout{L{1, 1, 2, 0, "zb1"}, 2, true, "none", kA2a},
        CpLayout{L{1, 1, 2, 0, "interleaved", 2}, 2, false, "full", kA2a},
        CpLayout{L{}, 2, true, "none", kA2a}, CpLayout{L{}, 4, true, "none", kA2a},
        CpLayout{L{1, 2, 1, 0, "1f1b", 1, true}, 2, true, "none", kA2a}),
    [](const auto& info) { return name_of(info.param); });

// --dtype bf16 with cp against the bf16 single rank (bf16_equiv_test's oracle and
// tolerances, derived there: a layout's changed f32 sums round to a different bf16 GEMM input
// one time in 2^8; loss 5e-4, grad norm 1e-3 relative, weights 1e-2 after 10 steps). The
// attention's pieces run on the f32 blockwise kernel as in f32.
constexpr int64_t kBf16Steps = 10;

TrainOptions bf16_options(const CpLayout& c) {
  TrainOptions o = cp_options(c);
  o.steps = kBf16Steps;
  o.dtype = "bf16";
  return o;
}

const Oracle& bf16_oracle() {
  static const Oracle r = [] {
    CpLayout one;
    one.cp = 1;
    TrainOptions o = bf16_options(one);
    o.attention = "naive";
    Oracle out;
    out.weights = (test::dir3d() / "cp_oracle_bf16.safetensors").string();
    o.export_path = out.weights;
    out.result = run_training(o);
    return out;
  }();
  return r;
}

class CpBf16Equiv : public ::testing::TestWithParam<CpLayout> {};

TEST_P(CpBf16Equiv, MatchesTheBf16SingleRank) {
  const CpLayout c = GetParam();
  const Oracle& ref = bf16_oracle();
  TrainOptions o = bf16_options(c);
  o.export_path = (test::dir3d() / (name_of(c) + "_bf16.safetensors")).string();
  const TrainResult r = run_training(o);
  ASSERT_EQ(r.steps.size(), ref.result.steps.size());
  double worst = 0;
  for (size_t i = 0; i < r.steps.size(); ++i) {
    const StepRecord &a = r.steps[i], &b = ref.result.steps[i];
    EXPECT_NEAR(a.loss, b.loss, 5e-4) << "step " << i + 1;
    EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-3 * b.grad_norm) << "step " << i + 1;
    worst = std::max(worst, std::abs(static_cast<double>(a.loss) - b.loss));
    EXPECT_GT(a.cp_bytes, 0) << "step " << i + 1;
  }
  EXPECT_EQ(r.allocations_after_first_step, 0) << "the steady-state step allocates nothing";
  std::string where;
  const double pd = test::max_weight_diff(o.export_path, ref.weights, &where);
  EXPECT_LE(pd, 1e-2) << "in " << where;
  std::printf("%s bf16: max |loss diff| %.2e, max |weight diff| %.2e (%s)\n", name_of(c).c_str(),
              worst, pd, where.c_str());
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, CpBf16Equiv,
    ::testing::Values(CpLayout{L{}, 2}, CpLayout{L{2, 1, 1, 1}, 2, false, "none", kAg},
                      CpLayout{L{1, 2, 1, 0, "1f1b", 1, true}, 2, false, "none", kA2a},
                      CpLayout{L{1, 1, 2, 0, "zb1"}, 2}),
    [](const auto& info) { return name_of(info.param); });

}  // namespace
}  // namespace mt::train

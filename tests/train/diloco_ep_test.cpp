// DiLoCo with expert parallelism inside a site (docs/diloco.md "Sites with expert
// parallelism"): the sites are cut from the expert-dp group, so a site holds whole ep groups
// and the cross-site group joins the ranks that hold the same experts. One site with plain
// averaging is today's ep training bitwise; two sites of an ep group each take the outer step
// computed here from both sites' parameters, on every ep rank's experts, and train what two
// sites of two dp ranks without ep train.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <mutex>
#include <tuple>

#include "core/error.h"
#include "model/params.h"
#include "outer_reference.h"
#include "test_util.h"
#include "tiny_run.h"
#include "train/trainer.h"

namespace mt::train {
namespace {

const std::string& data() {
  static const std::string p = test::demo_tokens(test::scratch_dir("diloco_ep"));
  return p;
}

// The tiny model with 4 routed experts (top 2) in each of its 2 blocks.
TrainOptions tiny_moe(int64_t steps, int dp, int ep) {
  TrainOptions o = test::tiny_run(data(), steps, 32, 8);
  o.model.n_layer = 2;
  o.model.moe.n_experts = 4;
  o.model.moe.top_k = 2;
  o.moe.aux_loss = 0.01;
  o.dp = dp;
  o.ep = ep;
  o.backend = "local";
  o.keep_final_params = true;
  return o;
}

// --sites 1 --outer-optimizer average --outer-lr 1 with --ep 2 is today's ep training bitwise:
// ep 2 alone (dp 2) and ep 2 with ZeRO over the expert-dp group (dp 4), H = 3.
TEST(DilocoEp, OneSiteAveragingIsTodaysEpTrainingBitwise) {
  for (const auto& [dp, zero] :
       {std::pair{2, 0}, std::pair{4, 0}, std::pair{4, 1}, std::pair{4, 3}}) {
    const TrainOptions base = [&] {
      TrainOptions o = tiny_moe(7, dp, 2);
      o.zero = zero;
      return o;
    }();
    TrainOptions d = base;
    d.outer.sites = 1;
    d.outer.every = 3;
    d.outer.optimizer = "average";
    d.outer.lr = 1.0f;
    const TrainResult a = run_training(base), b = run_training(d);
    const std::string what = "dp " + std::to_string(dp) + " ep 2 zero " + std::to_string(zero);
    test::expect_bitwise_same(a, b, what);
    EXPECT_EQ(b.allocations_after_first_step, 0) << what;
    for (const StepRecord& s : b.steps) EXPECT_GT(s.ep_bytes, 0.0) << what;  // ep is on
  }
}

struct Seen {
  std::vector<float> before, site, after;
};

// Two sites, each one ep group of 2 ranks (dp 4, ep 2: the cross-site groups join ep rank e of
// both sites), H = 2, 4 steps, Nesterov 0.7 / 0.9: every outer step of every ep rank's shard
// (its dense parameters and its 2 experts) equals the update computed here in double from the
// outer parameters before it and both sites' parameters at that ep rank; the two ep ranks' outer
// parameters differ in the experts only (some elements agree: the dense ones); the
// bytes between sites are each ep rank's all-reduce of its whole shard; and the run trains
// what 2 sites of 2 dp ranks without ep train (the same samples per rank, the experts'
// gradients summed in another order: the 1e-4 of Diloco.ZeroShardsWithinASite).
TEST(DilocoEp, TwoSitesOfAnEpGroupEqualTheHandComputedOuterUpdate) {
  TrainOptions o = tiny_moe(4, 4, 2);
  o.eval_batches = 1;
  o.outer.sites = 2;
  o.outer.every = 2;
  std::mutex mu;
  std::map<std::tuple<int64_t, int, int>, Seen> seen;  // (round, site, ep rank)
  o.outer.observer = [&](const OuterStepView& v) {
    std::lock_guard lock(mu);
    EXPECT_EQ(v.position, 0);  // one expert-dp rank per site
    Seen& s = seen[{v.round, v.site, v.ep_rank}];
    s.before.assign(v.outer_before, v.outer_before + v.elems);
    s.site.assign(v.site_values, v.site_values + v.elems);
    s.after.assign(v.outer_after, v.outer_after + v.elems);
  };
  const TrainResult r = run_training(o);
  ASSERT_EQ(seen.size(), 8u);  // 2 rounds x 2 sites x 2 ep ranks
  const float lr = o.outer.lr, mu_ = o.outer.momentum;
  int64_t differ = 0;  // elements where the two ep ranks' shards differ
  for (int e = 0; e < 2; ++e) {
    const size_t n = seen.at({1, 0, e}).before.size();
    EXPECT_EQ(static_cast<int64_t>(n), r.padded_params);
    std::vector<double> m(n, 0.0);
    for (int64_t round = 1; round <= 2; ++round) {
      const Seen &s0 = seen.at({round, 0, e}), &s1 = seen.at({round, 1, e});
      const std::string at = "ep rank " + std::to_string(e) + " round " + std::to_string(round);
      EXPECT_EQ(s0.before, s1.before) << at;
      EXPECT_EQ(s0.after, s1.after) << at;
      double worst = 0;
      for (size_t i = 0; i < n; ++i) {
        const double b = s0.before[i];
        const test::OuterStep o =
            test::nesterov_two_sites(b, s0.site[i], s1.site[i], m[i], lr, mu_);
        ASSERT_NEAR(s0.after[i], o.want, o.tol) << at << " element " << i;
        worst = std::max(worst, std::fabs(o.want - b));
      }
      EXPECT_GT(worst, 1e-4) << at << ": the outer step moved the weights";
    }
  }
  // The two ep ranks' shards: the dense parameters (and the padding) the same bits, the
  // experts not.
  const Seen &e0 = seen.at({2, 0, 0}), &e1 = seen.at({2, 0, 1});
  for (size_t i = 0; i < e0.after.size(); ++i) differ += e0.after[i] != e1.after[i];
  EXPECT_GT(differ, 0);
  EXPECT_LT(differ, static_cast<int64_t>(e0.after.size()));
  // The bytes between sites: per ep rank (one cross-site group each) an all-reduce over
  // S = 2 ranks of its own experts and its half of the dense elements (the two ep ranks hold
  // the same dense values: each sends half, and they gather the halves inside the site),
  // 2 (S - 1) x that x 4 bytes received in all; nothing else. The dense parameters cross
  // sites once: sending them from both ep ranks would add dense x 2 (S - 1) x 4 bytes.
  int64_t own = 0;  // one ep rank's expert elements (2 of the 4 experts)
  for (const model::ParamSpec& s : model::ep_shard_specs(model::gpt_param_specs(o.model), 0, 2))
    if (s.expert) own += shape_numel(s.shape);
  const int64_t dense = r.padded_params - own;  // the padding goes with the dense part
  ASSERT_GT(dense, 0);
  const double sent = 2.0 * static_cast<double>(own + (dense + 1) / 2);
  for (const StepRecord& s : r.steps) {
    const bool outer_step = s.step % 2 == 0;
    EXPECT_EQ(s.outer_bytes, outer_step ? 2 * (2 - 1) * sent * 4 : 0.0) << "step " << s.step;
    EXPECT_GT(s.ep_bytes, 0.0);
  }
  // Against 2 sites of 2 dp ranks each without ep (every rank all 4 experts).
  TrainOptions ref_o = o;
  ref_o.ep = 1;
  ref_o.outer.observer = nullptr;
  const TrainResult ref = run_training(ref_o);
  ASSERT_EQ(ref.steps.size(), r.steps.size());
  for (size_t i = 0; i < r.steps.size(); ++i)
    EXPECT_NEAR(r.steps[i].loss, ref.steps[i].loss, 1e-4) << "step " << i + 1;
  ASSERT_EQ(r.val_losses.size(), 1u);
  EXPECT_NEAR(r.val_losses[0].second, ref.val_losses[0].second, 1e-4);
}

// The other exchanges send the dense parameters once too: int8 (each ep rank's experts and
// its half of the dense elements, encoded: an all-to-all and an all-gather of
// 2 (S - 1) x S x words x 4 bytes per cross-site group) and the overlapped one (--outer-delay
// 1, 2 fragments: each fragment's experts and dense half, summed in the background, the
// halves gathered when it lands). The overlapped run trains what the same run without ep
// trains (1e-4, the order of the experts' sums), so the gathered halves are the whole mean.
TEST(DilocoEp, CompressedAndOverlappedExchangesSendTheDenseParametersOnce) {
  TrainOptions o = tiny_moe(6, 4, 2);
  o.eval_batches = 1;
  o.outer.sites = 2;
  o.outer.every = 2;
  int64_t own = 0;
  for (const model::ParamSpec& s : model::ep_shard_specs(model::gpt_param_specs(o.model), 0, 2))
    if (s.expert) own += shape_numel(s.shape);
  {
    TrainOptions c = o;
    c.outer.compress = "int8";
    const TrainResult r = run_training(c);
    const int64_t dense = r.padded_params - own;
    int64_t chunk = (own + (dense + 1) / 2 + 1) / 2;  // S = 2 chunks of whole 128-blocks
    chunk = (chunk + 127) / 128 * 128;
    const int64_t words = chunk / 128 + chunk / 4;
    for (const StepRecord& s : r.steps) {
      const bool outer_step = s.step % 2 == 0;
      EXPECT_EQ(s.outer_bytes, outer_step ? 2 * 2.0 * (2 - 1) * 2 * double(words) * 4 : 0.0)
          << "int8 step " << s.step;
    }
  }
  TrainOptions d = o;
  d.outer.fragments = 2;
  d.outer.delay = 1;
  const TrainResult r = run_training(d);
  TrainOptions ref_o = d;
  ref_o.ep = 1;
  const TrainResult ref = run_training(ref_o);
  ASSERT_EQ(ref.steps.size(), r.steps.size());
  double sent = 0, ref_sent = 0;
  int exchanges = 0;
  for (size_t i = 0; i < r.steps.size(); ++i) {
    EXPECT_NEAR(r.steps[i].loss, ref.steps[i].loss, 1e-4) << "step " << i + 1;
    sent += r.steps[i].outer_bytes;
    ref_sent += ref.steps[i].outer_bytes;
    exchanges += r.steps[i].outer_bytes > 0;
  }
  // Without ep each site's 2 ranks send their halves of the whole model (4 experts and the
  // dense elements); with ep each rank its 2 experts and half the dense elements: the same
  // bytes but for rounding, each fragment's dense half rounded up (at most 1 element per
  // rank) and the layouts' padding (at most 3 elements per rank), 2 (S - 1) x 4 bytes per
  // element per rank. Sending the dense elements from both ep ranks would add about
  // `dense` elements per exchange.
  const double slack = static_cast<double>(exchanges) * 2 * (1 + 3) * 2 * (2 - 1) * 4;
  EXPECT_NEAR(sent, ref_sent, slack);
  EXPECT_GT(static_cast<double>(r.padded_params - own) * 2 * (2 - 1) * 4, slack * 100);
}

// A site must hold whole ep groups: --dp 4 --ep 4 --sites 2 is refused naming the fix.
TEST(DilocoEp, ASiteSmallerThanAnEpGroupIsRefused) {
  TrainOptions o = tiny_moe(2, 4, 4);
  o.outer.sites = 2;
  try {
    o.validate();
    FAIL() << "validated";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("whole expert-parallel groups"), std::string::npos)
        << e.what();
    EXPECT_EQ(e.code(), ExitCode::kBadInput);
  }
  o.ep = 2;
  EXPECT_NO_THROW(o.validate());
}

}  // namespace
}  // namespace mt::train

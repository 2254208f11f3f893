// DiLoCo (train/outer_optimizer.h, docs/diloco.md): the degenerate settings are today's
// training bitwise; a 2-site run's outer steps equal the update computed here from the sites'
// parameters; ZeRO and several ranks inside a site; the outer exchange's bytes counted
// exactly; the compressed exchange within its derived bound; bad combinations refused.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <mutex>
#include <random>
#include <tuple>

#include "core/error.h"
#include "outer_reference.h"
#include "test_util.h"
#include "tiny_run.h"
#include "train/outer_compress.h"
#include "train/trainer.h"

namespace mt::train {
namespace {

const std::string& data() {
  static const std::string p = test::demo_tokens(test::scratch_dir("diloco"));
  return p;
}

TrainOptions tiny(int64_t steps, int dp) {
  TrainOptions o = test::tiny_run(data(), steps, 32, 8);
  o.model.n_layer = 2;
  o.dp = dp;
  o.backend = "local";
  o.keep_final_params = true;
  return o;
}

// One site with plain averaging at outer lr 1 is today's training, bitwise, in every ZeRO
// stage (the site is the whole dp group): the outer step sets the outer parameters to the
// site's exactly and the site continues from them.
TEST(Diloco, OneSiteAveragingIsTodaysTrainingBitwise) {
  for (int dp : {1, 2}) {
    for (int zero = 0; zero <= (dp > 1 ? 3 : 0); ++zero) {
      TrainOptions base = tiny(7, dp);
      base.zero = zero;
      TrainOptions d = base;
      d.outer.sites = 1;
      d.outer.every = 3;
      d.outer.optimizer = "average";
      d.outer.lr = 1.0f;
      const TrainResult a = run_training(base), b = run_training(d);
      test::expect_bitwise_same(a, b, "dp " + std::to_string(dp) + " zero " + std::to_string(zero));
      EXPECT_EQ(b.allocations_after_first_step, 0);
      d.outer.fragments = 2;  // streaming: each fragment's outer step as exact
      test::expect_bitwise_same(a, run_training(d), "fragments 2, zero " + std::to_string(zero));
      d.outer.fragments = 1;
      // The outer step runs (it is no shortcut): Nesterov's outer step changes the weights.
      if (zero == 0) {
        d.outer.optimizer = "nesterov";
        d.outer.lr = 0.7f;
        EXPECT_NE(run_training(d).final_params, a.final_params);
      }
    }
  }
}

// What the observer saw: (round, site) -> the rank's outer parameters before and after, and
// the site's parameters after the round's inner steps (one rank per site: the whole shard).
struct Seen {
  int fragment = 0;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  std::vector<float> before, site, after;
};
using Rounds = std::map<std::pair<int64_t, int>, Seen>;

OuterOptions observed(OuterOptions o, Rounds& seen, std::mutex& mu) {
  o.observer = [&seen, &mu](const OuterStepView& v) {
    std::lock_guard lock(mu);
    Seen& s = seen[{v.round, v.site}];
    s.fragment = v.fragment;
    s.ranges = *v.ranges;
    s.before.assign(v.outer_before, v.outer_before + v.elems);
    s.site.assign(v.site_values, v.site_values + v.elems);
    s.after.assign(v.outer_after, v.outer_after + v.elems);
  };
  return o;
}

// Two sites of one rank each: each outer step equals the update computed here in double
// from the outer parameters before it and both sites' parameters (m <- μ m + Δ̄,
// θ <- θ - lr (Δ̄ + μ m), Δ̄ the mean of θ - θ_site) on the stepped fragment's elements, the
// others unchanged; both sites start every round from the same outer parameters, which are
// the run's final weights. H = 2 with one fragment (3 rounds); streaming, H = 4 with two
// fragments (fragment 0 after steps 2 and 6, fragment 1 after 4 and 8, both after the last).
TEST(Diloco, TwoSitesEqualTheHandComputedOuterUpdate) {
  for (int fragments : {1, 2}) {
    TrainOptions o = tiny(fragments == 1 ? 6 : 8, 2);
    std::mutex mu;
    Rounds seen;
    o.outer.sites = 2;
    o.outer.every = 2 * fragments;
    o.outer.fragments = fragments;
    o.outer = observed(o.outer, seen, mu);
    const TrainResult r = run_training(o);
    const int64_t rounds = fragments == 1 ? 3 : 5;
    const std::vector<int> stepped =
        fragments == 1 ? std::vector<int>{0, 0, 0} : std::vector<int>{0, 1, 0, 0, 1};
    ASSERT_EQ(seen.size(), static_cast<size_t>(2 * rounds));
    const float lr = o.outer.lr, mu_ = o.outer.momentum;
    const size_t n = seen.at({1, 0}).before.size();
    std::vector<double> m(n, 0.0);
    std::vector<int64_t> covered(static_cast<size_t>(fragments), 0);
    for (int64_t round = 1; round <= rounds; ++round) {
      const Seen &s0 = seen.at({round, 0}), &s1 = seen.at({round, 1});
      const std::string at =
          "fragments " + std::to_string(fragments) + " round " + std::to_string(round);
      EXPECT_EQ(s0.fragment, stepped[static_cast<size_t>(round - 1)]) << at;
      EXPECT_EQ(s0.ranges, s1.ranges) << at;
      EXPECT_EQ(s0.before, s1.before) << at;  // the same outer parameters
      EXPECT_EQ(s0.after, s1.after) << at;
      if (round > 1) {
        EXPECT_EQ(s0.before, seen.at({round - 1, 0}).after) << at;
      }
      std::vector<char> in(n, 0);
      for (const auto& [a, b] : s0.ranges) {
        std::fill(in.begin() + a, in.begin() + b, 1);
        if (round <= fragments) covered[static_cast<size_t>(s0.fragment)] += b - a;
      }
      double worst = 0;
      for (size_t i = 0; i < n; ++i) {
        const double b = s0.before[i];
        if (!in[i]) {
          ASSERT_EQ(s0.after[i], s0.before[i]) << at << " element " << i << " (not stepped)";
          continue;
        }
        // The tolerance: the code's f32 roundings (test::nesterov_two_sites says how many).
        const test::OuterStep o =
            test::nesterov_two_sites(b, s0.site[i], s1.site[i], m[i], lr, mu_);
        ASSERT_NEAR(s0.after[i], o.want, o.tol) << at << " element " << i;
        worst = std::max(worst, std::fabs(o.want - b));
      }
      EXPECT_GT(worst, 1e-4) << at << ": the outer step moved the weights";
    }
    // The fragments together are the whole shard, each a part of it.
    int64_t total = 0;
    for (int64_t c : covered) {
      EXPECT_GT(c, 0);
      total += c;
    }
    EXPECT_EQ(total, static_cast<int64_t>(n));
    const std::vector<float>& last = seen.at({rounds, 0}).after;
    ASSERT_GE(last.size(), r.final_params.size());
    EXPECT_TRUE(std::equal(r.final_params.begin(), r.final_params.end(), last.begin()));
  }
}

// --outer-warmup-steps W: the first W steps are synchronous dp over all sites. 2 sites of
// one rank against dp 2: the losses and gradient norms of the W warm-up steps, and the loss
// of step W + 1 (after the last warm-up update), equal synchronous training's up to the order
// of f32 operations: each site's mean gradient (scaled by S / (B T)) averaged over the sites
// instead of the sum scaled by 1 / (B T), a few roundings (~2^-22 relative) per gradient
// element, which AdamW's update (g / sqrt(v)) carries over about as much relative; 1e-5 of the
// loss is far above that and far below what the sites' own steps change (checked below:
// without the warm-up the loss of step 2 already differs by more than 1e-4). The rounds count
// from W: with W = 3, H = 2 and 7 steps, outer steps after steps 5 and 7 only (without the
// warm-up after 2, 4, 6 and 7), and both sites start them from the same bits.
TEST(Diloco, WarmupIsSynchronousDpThenRoundsFromIt) {
  const TrainOptions base = tiny(7, 2);
  const TrainResult sync = run_training(base);
  TrainOptions d = base;
  d.outer.sites = 2;
  d.outer.every = 2;
  d.outer.warmup = 3;
  std::mutex mu;
  Rounds seen;
  d.outer = observed(d.outer, seen, mu);
  const TrainResult w = run_training(d);
  ASSERT_EQ(w.steps.size(), 7u);
  for (size_t i = 0; i <= 3; ++i) {
    EXPECT_NEAR(w.steps[i].loss, sync.steps[i].loss, 1e-5 * sync.steps[i].loss) << "step " << i + 1;
    if (i < 3) {
      EXPECT_NEAR(w.steps[i].grad_norm, sync.steps[i].grad_norm, 1e-5 * sync.steps[i].grad_norm)
          << "step " << i + 1;
    }
  }
  EXPECT_EQ(seen.size(), 4u);  // rounds 1 and 2, each seen by both sites
  for (int64_t round : {1, 2}) EXPECT_EQ(seen.at({round, 0}).before, seen.at({round, 1}).before);
  d.outer.warmup = 0;
  seen.clear();
  const TrainResult own = run_training(d);
  EXPECT_GT(std::fabs(own.steps[1].loss - sync.steps[1].loss), 1e-4 * sync.steps[1].loss);
  EXPECT_EQ(seen.size(), 8u);
}

// --outer-delay τ (streaming DiLoCo's overlap): 2 sites of one rank, 2 fragments, H = 4,
// τ = 1, α = 0.5, 10 steps. Fragment 0's exchange starts after steps 2 and 6 and lands after
// 3 and 7, fragment 1's after 4 and 8, landing after 5 and 9; after step 10 both take the
// blocking final step. Each landed step equals its definition computed here in double: Δ̄
// the mean over the sites of θ - θ_sent (θ_sent: the site's values when the exchange
// started, one inner step before landing), Nesterov's update, and each site's values
// α θ_site + (1 - α) θ_new. The exchange moves exactly the bytes of the blocking run.
TEST(Diloco, OverlappedExchangeEqualsItsDefinition) {
  TrainOptions o = tiny(10, 2);
  o.outer.sites = 2;
  o.outer.every = 4;
  o.outer.fragments = 2;
  const TrainResult blocking = run_training(o);
  o.outer.delay = 1;
  o.outer.mix = 0.5f;
  struct View {
    int fragment = 0;
    std::vector<std::pair<int64_t, int64_t>> ranges;
    std::vector<float> before, now, after, sent, site_after;
  };
  std::mutex mu;
  std::map<std::pair<int64_t, int>, View> seen;
  o.outer.observer = [&](const OuterStepView& v) {
    std::lock_guard lock(mu);
    View& s = seen[{v.round, v.site}];
    s.fragment = v.fragment;
    s.ranges = *v.ranges;
    s.before.assign(v.outer_before, v.outer_before + v.elems);
    s.now.assign(v.site_values, v.site_values + v.elems);
    s.after.assign(v.outer_after, v.outer_after + v.elems);
    s.sent.assign(v.site_sent, v.site_sent + v.elems);
    s.site_after.assign(v.site_after, v.site_after + v.elems);
  };
  const TrainResult r = run_training(o);
  ASSERT_EQ(seen.size(), 12u);  // 4 overlapped and 2 final rounds, each seen by both sites
  const std::vector<int> fragment = {0, 1, 0, 1, 0, 1};
  const float lr = o.outer.lr, mu_ = o.outer.momentum, a = o.outer.mix;
  const size_t n = seen.at({1, 0}).before.size();
  std::vector<double> m(n, 0.0);
  for (int64_t round = 1; round <= 6; ++round) {
    const View &s0 = seen.at({round, 0}), &s1 = seen.at({round, 1});
    const std::string at = "round " + std::to_string(round);
    EXPECT_EQ(s0.fragment, fragment[static_cast<size_t>(round - 1)]) << at;
    EXPECT_EQ(s0.before, s1.before) << at;
    EXPECT_EQ(s0.after, s1.after) << at;
    if (round > 4) {  // the blocking final step: the site's values now, then the outer ones
      EXPECT_EQ(s0.sent, s0.now) << at;
      EXPECT_EQ(s0.site_after, s0.after) << at;
      continue;
    }
    std::vector<char> in(n, 0);
    for (const auto& [lo, hi] : s0.ranges) std::fill(in.begin() + lo, in.begin() + hi, 1);
    double moved = 0;
    for (size_t i = 0; i < n; ++i) {
      const double b = s0.before[i];
      if (!in[i]) {
        ASSERT_EQ(s0.after[i], s0.before[i]) << at << " element " << i << " (not stepped)";
        continue;
      }
      const test::OuterStep o = test::nesterov_two_sites(b, s0.sent[i], s1.sent[i], m[i], lr, mu_);
      ASSERT_NEAR(s0.after[i], o.want, o.tol) << at << " element " << i;
      for (const View* s : {&s0, &s1}) {
        // Two products and a sum in f32: 3 roundings of the magnitudes.
        const double mixed = a * double(s->now[i]) + (1 - a) * double(s->after[i]);
        ASSERT_NEAR(s->site_after[i], mixed,
                    std::ldexp(std::fabs(s->now[i]) + std::fabs(s->after[i]), -22))
            << at << " element " << i;
        moved = std::max(moved, std::fabs(double(s->now[i]) - s->sent[i]));
      }
    }
    EXPECT_GT(moved, 1e-5) << at << ": an inner step ran while the exchange was in flight";
  }
  double bytes_blocking = 0, bytes_overlapped = 0;
  for (const StepRecord& s : blocking.steps) bytes_blocking += s.outer_bytes;
  for (const StepRecord& s : r.steps) bytes_overlapped += s.outer_bytes;
  EXPECT_GT(bytes_blocking, 0);
  EXPECT_EQ(bytes_overlapped, bytes_blocking);
  EXPECT_NE(r.final_params, blocking.final_params);  // the mixing is no shortcut
}

// ZeRO shards inside a site: 2 sites of 2 ranks each, in every stage, train what 2 sites of
// one rank train. Only the order of f32 sums differs (a site's gradient summed over two
// ranks' halves): relative ~1e-6 per step, compounded over 4 Adam steps and 2 outer steps,
// as GradientAccumulationMatchesOneBigBatch bounds it.
TEST(Diloco, ZeroShardsWithinASite) {
  TrainOptions one = tiny(4, 2);
  one.outer.sites = 2;
  one.outer.every = 2;
  const TrainResult ref = run_training(one);
  for (int zero = 0; zero <= 3; ++zero) {
    TrainOptions o = one;
    o.dp = 4;
    o.zero = zero;
    const TrainResult r = run_training(o);
    EXPECT_EQ(r.allocations_after_first_step, 0) << "zero " << zero;
    ASSERT_EQ(r.final_params.size(), ref.final_params.size());
    double max_diff = 0;
    for (size_t i = 0; i < r.final_params.size(); ++i)
      max_diff = std::max(max_diff,
                          std::fabs(static_cast<double>(r.final_params[i]) - ref.final_params[i]));
    EXPECT_LT(max_diff, 1e-4) << "zero " << zero;
    for (size_t i = 0; i < r.steps.size(); ++i)
      EXPECT_NEAR(r.steps[i].loss, ref.steps[i].loss, 1e-4) << "zero " << zero;
  }
}

// tp, pp and cp inside a site: 2 sites of one dp rank each, each site a tp 2, pp 2 or cp 2
// group, train what 2 sites of one rank train: the losses agree to the summation order (the
// same 1e-4 as above; the final weights are per-rank shards here, the losses are global).
TEST(Diloco, OtherDimensionsInsideASite) {
  TrainOptions one = tiny(4, 2);
  one.outer.sites = 2;
  one.outer.every = 2;
  one.eval_batches = 1;
  const TrainResult ref = run_training(one);
  for (const char* dim : {"tp", "pp", "cp"}) {
    TrainOptions o = one;
    if (std::string(dim) == "tp") o.tp = 2;
    if (std::string(dim) == "pp") o.pipeline.pp = 2;
    if (std::string(dim) == "cp") o.cp = 2;
    const TrainResult r = run_training(o);
    ASSERT_EQ(r.steps.size(), ref.steps.size()) << dim;
    for (size_t i = 0; i < r.steps.size(); ++i) {
      EXPECT_NEAR(r.steps[i].loss, ref.steps[i].loss, 1e-4) << dim << " step " << i + 1;
      EXPECT_EQ(r.steps[i].outer_step, ref.steps[i].outer_step) << dim;
      EXPECT_GT(r.steps[i].outer_step ? r.steps[i].outer_bytes : 1.0, 0.0) << dim;
    }
    ASSERT_EQ(r.val_losses.size(), 1u);
    EXPECT_NEAR(r.val_losses[0].second, ref.val_losses[0].second, 1e-4) << dim;
  }
}

// The outer exchange's bytes, summed over ranks, per step: an all-reduce of E elements over
// S ranks receives 2 (S - 1) E x 4 bytes in all (comm/local.cpp's count), once per
// cross-site group; the compressed exchange an all-to-all and an all-gather of the encoded
// chunks, 2 (S - 1) x S x words x 4. Nothing else travels between sites: with one rank per
// site the dp (gradient) traffic is 0.
TEST(Diloco, OuterBytesCountedExactly) {
  for (const std::string compress : {"none", "bf16", "int8"}) {
    for (int dp : {2, 4}) {
      TrainOptions o = tiny(5, dp);
      o.zero = 1;
      o.outer.sites = 2;
      o.outer.every = 2;
      o.outer.compress = compress;
      const TrainResult r = run_training(o);
      const int S = 2, per_site = dp / S;
      // The shard of each rank inside its site (ZeRO over the site's dp group).
      const int64_t padded = r.padded_params, n = padded / per_site;
      double want = 0;
      if (compress == "none") {
        want = per_site * 2.0 * (S - 1) * static_cast<double>(n) * 4;
      } else {
        int64_t c = (n + S - 1) / S;
        c = (c + 127) / 128 * 128;
        const int64_t words = compress == "bf16" ? c / 2 : c / 128 + c / 4;
        want = per_site * 2.0 * (S - 1) * S * static_cast<double>(words) * 4;
      }
      for (const StepRecord& s : r.steps) {
        const bool outer_step = s.step % 2 == 0 || s.step == 5;
        EXPECT_EQ(s.outer_step, outer_step) << "step " << s.step;
        EXPECT_EQ(s.outer_bytes, outer_step ? want : 0.0)
            << compress << " dp " << dp << " step " << s.step;
        if (per_site == 1) {
          EXPECT_EQ(s.dp_bytes, 0.0) << "step " << s.step;
        }
      }
      EXPECT_EQ(r.allocations_after_first_step, 0) << compress;
    }
  }
}

// Streaming: with two fragments the outer bytes of a step are those of the fragment stepped,
// together the whole shard's, the largest well under it (the peak need drops).
TEST(Diloco, StreamingSpreadsTheOuterBytes) {
  TrainOptions o = tiny(8, 2);
  o.outer.sites = 2;
  o.outer.every = 4;
  o.outer.fragments = 2;
  const TrainResult r = run_training(o);
  const double whole = 2.0 * (2 - 1) * static_cast<double>(r.padded_params) * 4;
  std::vector<double> bytes;
  for (const StepRecord& s : r.steps) bytes.push_back(s.outer_bytes);
  EXPECT_EQ(bytes, (std::vector<double>{0, bytes[1], 0, bytes[3], 0, bytes[1], 0, whole}));
  EXPECT_EQ(bytes[1] + bytes[3], whole);  // fragment 0 after steps 2 and 6, 1 after 4
  EXPECT_GT(bytes[1], 0);
  EXPECT_LT(std::max(bytes[1], bytes[3]), 0.8 * whole);
  EXPECT_EQ(r.allocations_after_first_step, 0);
}

// One encode/decode of each element is within the bound of train/outer_compress.h, and the
// bound is tight (some element comes within 90% of it).
TEST(Diloco, CompressionRoundTripWithinItsBound) {
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t n = 128 * 512;
  std::vector<float> x(n), y(n);
  for (int64_t i = 0; i < n; ++i)
    x[static_cast<size_t>(i)] = normal(gen) * std::ldexp(1.0f, static_cast<int>(i / 128 % 40) - 30);
  for (OuterCompress c : {OuterCompress::kBf16, OuterCompress::kInt8}) {
    std::vector<int32_t> words(static_cast<size_t>(outer_encoded_words(c, n)));
    outer_encode(c, x.data(), n, words.data());
    outer_decode(c, words.data(), n, y.data());
    double worst_ratio = 0;
    for (int64_t b = 0; b < n / 128; ++b) {
      double block_max = 0;
      for (int64_t i = b * 128; i < b * 128 + 128; ++i)
        block_max = std::max(block_max, std::fabs(static_cast<double>(x[static_cast<size_t>(i)])));
      for (int64_t i = b * 128; i < b * 128 + 128; ++i) {
        const double xi = x[static_cast<size_t>(i)];
        const double bound =
            outer_roundtrip_bound(c, c == OuterCompress::kBf16 ? std::fabs(xi) : block_max);
        const double err = std::fabs(y[static_cast<size_t>(i)] - xi);
        ASSERT_LE(err, bound) << outer_compress_name(c) << " element " << i;
        if (bound > 0) worst_ratio = std::max(worst_ratio, err / bound);
      }
    }
    EXPECT_GT(worst_ratio, 0.9) << outer_compress_name(c);
  }
  EXPECT_EQ(outer_encoded_words(OuterCompress::kInt8, 256), 2 + 64);
  EXPECT_EQ(outer_encoded_words(OuterCompress::kBf16, 256), 128);
}

// The compressed exchange in training: with plain averaging at lr 1 the new outer parameters
// are θ - Δ̄ exactly but for the compression, so each element's error against the exact mean
// of the sites' pseudo-gradients is within the bound of docs/diloco.md: both encodings
// (the sites' pseudo-gradients, then their mean) and the f32 sum, division and update.
TEST(Diloco, CompressedExchangeWithinItsDerivedBound) {
  for (OuterCompress c : {OuterCompress::kBf16, OuterCompress::kInt8}) {
    TrainOptions o = tiny(4, 2);
    std::mutex mu;
    Rounds seen;
    o.outer.sites = 2;
    o.outer.every = 2;
    o.outer.optimizer = "average";
    o.outer.lr = 1.0f;
    o.outer.compress = outer_compress_name(c);
    o.outer = observed(o.outer, seen, mu);
    (void)run_training(o);
    ASSERT_EQ(seen.size(), 4u);
    const double S = 2, eps = std::ldexp(1.0, -24);
    double worst_ratio = 0, worst_err = 0;
    for (int64_t round = 1; round <= 2; ++round) {
      const Seen &s0 = seen.at({round, 0}), &s1 = seen.at({round, 1});
      const size_t n = s0.before.size();
      for (size_t b0 = 0; b0 < n; b0 += 128) {
        double k = 0;  // int8: the mean over sites of the block's max |Δ_site|
        for (const Seen* s : {&s0, &s1}) {
          double mx = 0;
          for (size_t i = b0; i < std::min(n, b0 + 128); ++i)
            mx = std::max(mx, std::fabs(static_cast<double>(s->before[i]) - s->site[i]));
          k += mx / S;
        }
        for (size_t i = b0; i < std::min(n, b0 + 128); ++i) {
          const double b = s0.before[i];
          const double d0 = b - s0.site[i], d1 = b - s1.site[i];
          const double want = b - (d0 + d1) / S;
          const double a = (std::fabs(d0) + std::fabs(d1)) / S;
          const double u = std::ldexp(1.0, -8);
          const double bound =
              (c == OuterCompress::kBf16 ? a * (2 * u + u * u + (S + 3) * eps * (1 + u) * (1 + u))
                                         : k * ((1 + std::ldexp(1.0, -14)) *
                                                    (2 + 1.0 / 254 + std::ldexp(1.0, -14)) / 254 +
                                                (S + 3) * 2 * eps)) +
              eps * (std::fabs(want) + std::fabs(b)) + 1e-37;
          const double err = std::fabs(s0.after[i] - want);
          ASSERT_LE(err, bound) << outer_compress_name(c) << " round " << round << " element " << i;
          worst_ratio = std::max(worst_ratio, err / bound);
          worst_err = std::max(worst_err, err);
        }
      }
    }
    EXPECT_GT(worst_err, 0) << "the exchange was compressed";
    std::printf("%s: worst error %.3g, %.2f of its bound\n", outer_compress_name(c), worst_err,
                worst_ratio);
  }
}

std::string refusal(const TrainOptions& o) {
  try {
    o.validate();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput) << e.what();
    return e.what();
  }
  return "";
}

TEST(Diloco, BadCombinationsAreRefusedNamingTheFix) {
  TrainOptions o = tiny(4, 4);
  o.outer.sites = 3;
  EXPECT_NE(refusal(o).find("--sites 3 does not divide --dp 4"), std::string::npos) << refusal(o);
  EXPECT_NE(refusal(o).find("1, 2, 4"), std::string::npos) << refusal(o);
  o.outer.sites = 2;
  EXPECT_EQ(refusal(o), "");
  o.outer.every = 0;
  EXPECT_NE(refusal(o).find("--outer-every 0 must be at least 1"), std::string::npos);
  o.outer.every = 5;
  o.outer.optimizer = "adam";
  EXPECT_NE(refusal(o).find("--outer-optimizer 'adam'"), std::string::npos);
  o.outer.optimizer = "nesterov";
  o.outer.momentum = 1.0f;
  EXPECT_NE(refusal(o).find("--outer-momentum 1 must be in [0, 1)"), std::string::npos);
  o.outer.momentum = 0.9f;
  o.outer.lr = -1;
  EXPECT_NE(refusal(o).find("--outer-lr -1"), std::string::npos);
  o.outer.lr = 0.7f;
  o.outer.compress = "fp8";
  EXPECT_NE(refusal(o).find("--outer-compress 'fp8'"), std::string::npos);
  o.outer.compress = "none";
  o.outer.fragments = 6;
  EXPECT_NE(refusal(o).find("--outer-fragments 6 must be between 1"), std::string::npos);
  o.outer.fragments = 1;
  o.outer.warmup = 4;  // the run's 4 steps: no outer round would follow
  EXPECT_NE(refusal(o).find("--outer-warmup-steps 4 must be between 0 and --steps 4 - 1"),
            std::string::npos)
      << refusal(o);
  o.outer.warmup = 0;
  o.outer.delay = 5;
  EXPECT_NE(refusal(o).find("--outer-delay 5 must be between 0 and --outer-every 5 - 1"),
            std::string::npos)
      << refusal(o);
  o.outer.delay = 2;
  o.outer.compress = "int8";
  EXPECT_NE(refusal(o).find("overlaps the f32 all-reduce only"), std::string::npos) << refusal(o);
  o.outer.compress = "none";
  o.checkpoint_dir = "unused";
  o.checkpoint_every = 2;
  EXPECT_NE(refusal(o).find("a checkpoint while an overlapped outer exchange"), std::string::npos)
      << refusal(o);
  o.checkpoint_every = 0;
  o.checkpoint_dir.clear();
  o.outer.delay = 0;
  o.outer.mix = 0.3f;
  EXPECT_NE(refusal(o).find("add --outer-delay"), std::string::npos) << refusal(o);
  o.outer.mix = 0.5f;
  o.outer.sites = 0;
  o.outer.every = 10;
  EXPECT_NE(refusal(o).find("add --sites S"), std::string::npos);
}

}  // namespace
}  // namespace mt::train

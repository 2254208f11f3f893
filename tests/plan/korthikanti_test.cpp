// Held-out validation of the time model: Korthikanti et al. 2022 ("Reducing Activation
// Recomputation in Large Transformer Models"), measured with the Megatron-LM of 2022 on the
// same A100 cluster as Narayanan et al. 2021 — whose Table 1 fitted our A100 GEMM curve. Nothing
// here is fitted: sequence parallelism, selective recomputation and the backward TP overlap
// are the model's own terms, run against published iteration times (Table 5) and per-layer
// times (Table 4).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>

#include "plan/planner.h"

namespace mt::plan {
namespace {

// Table 3 (configurations; no data parallelism, sequence 2048, vocabulary 51,200, T = 8; the
// interleaved schedule with 3 stages per rank for 175B and 530B) and Table 5 (iteration time
// in seconds: full recomputation without SP; "present work": SP + selective recomputation).
struct Config {
  const char* name;
  const char* preset;
  int64_t heads, hidden, layers;
  int pp, gpus, v;
  int64_t batch, microbatch;
  double full_s, present_s;
};
const Config kTable3[] = {
    {"22B", "megatron-18b", 64, 6144, 48, 1, 8, 1, 4, 4, 1.42, 1.10},
    {"175B", "gpt3-175b", 96, 12288, 96, 8, 64, 3, 64, 1, 18.13, 13.75},
    {"530B", "megatron-530b", 128, 20480, 105, 35, 280, 3, 280, 1, 49.05, 37.83},
    {"1T", "megatron-1t", 160, 25600, 128, 64, 512, 1, 512, 1, 94.42, 71.49},
};

Job job_of(const Config& c, int dp = 1) {
  Job j;
  j.model = model_preset(c.preset);
  j.model.n_head = j.model.n_kv_head = c.heads;
  j.model.d_model = c.hidden;
  j.model.d_ff = 4 * c.hidden;
  j.model.n_layer = c.layers;
  j.cluster = cluster_preset("dgx-a100");
  j.gpus = int64_t(c.gpus) * dp;
  j.batch = c.batch * dp;
  j.seq = 2048;
  j.model.seq = j.seq;
  j.dtype = "bf16";
  return j;
}

Layout layout_of(const Config& c, bool present, int dp = 1) {
  Layout l;
  l.tp = 8;
  l.pp = c.pp;
  l.dp = dp;
  l.virtual_stages = c.v;
  l.schedule = c.v > 1 ? "interleaved" : "1f1b";
  l.microbatch = c.microbatch;
  l.recompute = present ? Recompute::kSelective : Recompute::kFull;
  l.sp = present;
  // 2022: backward's TP collectives beside the weight gradients; unfused attention (the
  // reason for selective recomputation), blocking p2p, n_layer / (pp·v) layers per chunk.
  set_software(l, Software::kMegatron2022);
  l.dp_overlap = false;  // "we do not use any overlapping of gradient all-reduces"
  return l;
}

TEST(PlanTime, Korthikanti2022IterationTimes) {
  double sum_ape = 0, worst = 0;
  int n = 0;
  fmt::print("{:<5} {:<16} {:>10} {:>10} {:>7}\n", "model", "mode", "published", "predicted",
             "error");
  auto check = [&](const char* name, const char* mode, const Job& j, const Layout& l,
                   double published) {
    const Estimate e = estimate(j, l);
    const double err = e.step_time_s / published - 1;
    fmt::print("{:<5} {:<16} {:>9.2f}s {:>9.2f}s {:>6.1f}%\n", name, mode, published, e.step_time_s,
               100 * err);
    sum_ape += std::abs(err);
    worst = std::max(worst, std::abs(err));
    ++n;
  };
  for (const Config& c : kTable3) {
    check(c.name, "full recompute", job_of(c), layout_of(c, false), c.full_s);
    check(c.name, "SP + selective", job_of(c), layout_of(c, true), c.present_s);
  }
  // §6.3: the 530B on 8-way data parallelism (2240 GPUs, batch 8 x 280), reduction not
  // overlapped: 39.15 s.
  check("530B", "SP+sel, dp 8", job_of(kTable3[2], 8), layout_of(kTable3[2], true, 8), 39.15);
  const double mape = sum_ape / n;
  fmt::print("MAPE {:.2f}%, worst {:.2f}% (nothing fitted to these)\n", 100 * mape, 100 * worst);
  // Measured at 3.23% / 8.2% (docs/planner.md); the bars are the issue's, as for Table 1.
  EXPECT_LE(mape, 0.05);
  EXPECT_LE(worst, 0.10);
}

TEST(PlanTime, Korthikanti2022PerLayerTimes) {
  // Table 4: one transformer layer of the 22B model (microbatch 4, T = 8), forward and
  // backward in ms, for five settings.
  struct Row {
    const char* what;
    Recompute rc;
    bool sp;
    double fwd_ms, bwd_ms;
  };
  const Row rows[] = {{"baseline, no recompute", Recompute::kNone, false, 7.7, 11.9},
                      {"SP", Recompute::kNone, true, 7.2, 11.8},
                      {"full recompute", Recompute::kFull, false, 7.7, 19.5},
                      {"selective", Recompute::kSelective, false, 7.7, 13.2},
                      {"selective + SP", Recompute::kSelective, true, 7.2, 13.1}};
  const Config& c = kTable3[0];
  double worst = 0;
  fmt::print("{:<24} {:>10} {:>10} {:>10} {:>10}\n", "22B layer", "fwd pub", "fwd pred", "bwd pub",
             "bwd pred");
  for (const Row& r : rows) {
    Layout l = layout_of(c, false);
    l.recompute = r.rc;
    l.sp = r.sp;
    const Estimate e = estimate(job_of(c), l);
    const double fwd = e.layer_forward_s * 1e3, bwd = e.layer_backward_s * 1e3;
    fmt::print("{:<24} {:>10.1f} {:>10.2f} {:>10.1f} {:>10.2f}\n", r.what, r.fwd_ms, fwd, r.bwd_ms,
               bwd);
    worst = std::max({worst, std::abs(fwd / r.fwd_ms - 1), std::abs(bwd / r.bwd_ms - 1)});
  }
  fmt::print("worst per-layer error {:.1f}%\n", 100 * worst);
  EXPECT_LE(worst, 0.10);
}

TEST(PlanTime, ZeroBubbleBackwardDoesNotHideTpBehindLaterWeightGradients) {
  // The overlap needs the weight gradient right after the input gradient; zb1 runs it later.
  const Config& c = kTable3[1];
  Layout l = layout_of(c, true);
  l.virtual_stages = 1;
  l.schedule = "1f1b";
  const Estimate overlapped = estimate(job_of(c), l);
  l.schedule = "zb1";
  const Estimate split = estimate(job_of(c), l);
  EXPECT_GT(split.tp_comm_s, overlapped.tp_comm_s);
}

}  // namespace
}  // namespace mt::plan

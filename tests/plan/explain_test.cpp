// `plan --explain` (plan/explain.h): the stacked list sums to the step, each kernel item is the
// kernel's cost times the times the busiest rank runs it, and the list names the terms a
// layout has (none of those it has not).
#include "plan/explain.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "plan/kernels.h"
#include "plan/planner.h"
#include "plan_test_util.h"
#include "test_util.h"

namespace mt::plan {
namespace {

std::map<std::string, double> by_name(const std::vector<StepItem>& items) {
  std::map<std::string, double> m;
  for (const StepItem& it : items) m[it.name] += it.seconds;
  return m;
}

double sum(const std::vector<StepItem>& items) {
  double s = 0;
  for (const StepItem& it : items) s += it.seconds;
  return s;
}

Job gpt175b(const char* cluster, int64_t gpus, int64_t batch) {
  Job j;
  j.model = model_preset("gpt3-175b");
  j.cluster = cluster_preset(cluster);
  j.gpus = gpus;
  j.batch = batch;
  j.seq = 2048;
  j.model.seq = 2048;
  j.dtype = "bf16";
  return j;
}

Layout layout(int tp, int pp, int v, int dp, Recompute rc, bool sp, Software sw) {
  Layout l;
  l.tp = tp, l.pp = pp, l.dp = dp, l.virtual_stages = v;
  l.schedule = v > 1 ? "interleaved" : "1f1b";
  l.microbatch = 1;
  l.recompute = rc;
  l.sp = sp;
  set_software(l, sw);
  return l;
}

// Relative: the items are the estimate's own terms re-added, so only rounding differs.
constexpr double kSumTol = 1e-9;

TEST(PlanExplain, ItemsSumToTheStepForEveryKindOfLayout) {
  struct Case {
    const char* what;
    Job job;
    Layout l;
  };
  Layout z3 = layout(1, 1, 1, 64, Recompute::kFull, false, Software::kMegatron2021);
  z3.zero = 3;
  Layout ds = layout(1, 1, 1, 64, Recompute::kFull, false, Software::kDeepSpeed2021);
  ds.zero = 3;
  Layout cp = layout(4, 4, 5, 4, Recompute::kNone, true, Software::kToday);
  cp.cp = 2, cp.zero = 1, cp.tp_comm_overlap = true;
  Job llama = gpt175b("dgx-h100", 128, 128);
  llama.model = model_preset("llama3-70b");
  llama.seq = llama.model.seq = 8192;
  Layout tiny = layout(1, 2, 1, 2, Recompute::kNone, false, Software::kToday);
  tiny.microbatch = 2;
  const Case cases[] = {
      {"175B full recompute, interleaved (2022)", gpt175b("dgx-a100", 64, 64),
       layout(8, 8, 3, 1, Recompute::kFull, false, Software::kMegatron2022)},
      {"175B SP + selective", gpt175b("dgx-a100", 64, 64),
       layout(8, 8, 3, 1, Recompute::kSelective, true, Software::kMegatron2022)},
      {"175B ZeRO-3, no model parallelism", gpt175b("dgx-a100", 64, 256), z3},
      {"175B ZeRO-3 as DeepSpeed 2021 ran it", gpt175b("dgx-a100", 64, 256), ds},
      {"70B CP 2 with userbuffers", llama, cp},
      {"tiny f32 on a shared host, pp 2", test::runtime_tiny_job(4), tiny},
  };
  for (const Case& c : cases) {
    const Estimate e = estimate(c.job, c.l);
    const auto items = explain(c.job, e);
    EXPECT_NEAR(sum(items), e.step_time_s, kSumTol * e.step_time_s) << c.what;
    const auto m = by_name(items);
    // Nothing unaccounted on the busiest rank but ZeRO-3's exposed gathers (and a shared
    // host's p2p copies).
    if (c.l.zero < 3 && c.job.cluster.compute_units == 0) {
      EXPECT_NEAR(m.at("other"), 0.0, 1e-9 * e.step_time_s) << c.what;
    }
    if (c.l.zero >= 3) {
      EXPECT_GT(m.at("ZeRO-3 gathers beyond compute"), -1e-12) << c.what;
    }
    if (c.l.zero >= 3 && c.l.z3_bytes_per_s > 0) {  // DeepSpeed 2021's gathers outlast compute
      EXPECT_GT(m.at("ZeRO-3 gathers beyond compute"), 0.1 * e.step_time_s) << c.what;
    }
    if (c.l.pp == 1) {
      EXPECT_NEAR(m.at("pipeline bubble + blocking p2p"), 0.0, 1e-12) << c.what;
    }
    if (c.l.cp == 1) {
      EXPECT_EQ(m.at("CP ring communication (exposed)"), 0.0) << c.what;
    }
    fmt::print("{}:\n{}", c.what, explain_text(items, e.step_time_s));
  }
}

TEST(PlanExplain, AGemmItemIsItsKernelTimesItsRuns) {
  // No pipeline, full recomputation: the busiest (only) rank runs every layer's MLP-in GEMM
  // once forward, twice backward and once recomputed, for each microbatch.
  const Job j = gpt175b("dgx-a100", 8, 16);
  Layout l = layout(8, 1, 1, 1, Recompute::kFull, false, Software::kMegatron2022);
  const Estimate e = estimate(j, l);
  const LayerKernels k = layer_kernels(j, e.layout, 1.0);
  const auto m = by_name(explain(j, e));
  const double runs = double(e.microbatches) * double(j.model.n_layer) * 4;
  EXPECT_DOUBLE_EQ(m.at("GEMM: MLP in"), runs * k.mlp_in);
  // Its FLOPs at the curve's rate for the shape [b·s, 4h/t] × [h]: nothing else in the item.
  const double n = 2048, F = double(j.model.d_ff) / 8, h = double(j.model.d_model);
  const double peak = j.cluster.gpu.peak_flops("bf16");
  EXPECT_NEAR(k.mlp_in, 2 * n * F * h / (peak * j.cluster.gpu.gemm.efficiency(n, F, h)), 1e-12);
}

// Vocabulary parallelism with tp 8 in a node: per microbatch the embedding's output and the
// LM head's input gradient are all-reduced over tp (b·s·h values in the weights' bytes), and
// Megatron-LM's cross-entropy all-reduces b·s fp32 values three times. The item is exactly
// that (ring all-reduce: 2(n-1)/n of the bytes over NVLink plus 2(n-1) latencies); tp 1 has
// none. Dropping any one of the five collectives fails the first check (one cross-entropy
// all-reduce fewer: 5.4% less, against a rounding tolerance of 1e-9 of the step).
TEST(PlanExplain, VocabularyParallelCollectivesAreTheirOwnItem) {
  const Job j = gpt175b("dgx-a100", 8, 16);
  const Estimate e =
      estimate(j, layout(8, 1, 1, 1, Recompute::kFull, false, Software::kMegatron2022));
  const auto m = by_name(explain(j, e));
  const double n = 2048.0 * double(e.layout.microbatch), h = double(j.model.d_model);
  const double bw = j.cluster.intra_bytes_per_s, lat = j.cluster.intra_latency_s;
  auto all_reduce = [&](double bytes) { return 2.0 * 7 / 8 * bytes / bw + 2.0 * 7 * lat; };
  const double one = 2 * all_reduce(n * h * 2) + 3 * all_reduce(n * 4);
  EXPECT_NEAR(m.at("TP vocabulary-parallel collectives"), double(e.microbatches) * one,
              1e-9 * e.step_time_s);
  EXPECT_DOUBLE_EQ(e.tp_vocab_s, m.at("TP vocabulary-parallel collectives"));
  const Estimate e1 = estimate(gpt175b("dgx-a100", 64, 64), layout(1, 8, 1, 8, Recompute::kFull,
                                                                   false, Software::kMegatron2022));
  EXPECT_EQ(e1.tp_vocab_s, 0.0);
}

TEST(PlanExplain, ThePlanCommandPrintsTheList) {
  // The text has one line per nonzero item and the step; checked on the library's output,
  // which `plan --explain` prints as it is (PlanCli tests the flag itself).
  const Job j = gpt175b("dgx-a100", 64, 64);
  const Estimate e =
      estimate(j, layout(8, 8, 3, 1, Recompute::kFull, false, Software::kMegatron2022));
  const std::string text = explain_text(explain(j, e), e.step_time_s);
  EXPECT_NE(text.find("GEMM: MLP in"), std::string::npos);
  EXPECT_NE(text.find("pipeline bubble"), std::string::npos);
  EXPECT_EQ(text.find("CP ring"), std::string::npos);  // zero: not listed
  EXPECT_NE(text.find("step"), std::string::npos);
}

TEST(PlanExplain, PlanExplainPrintsTheBestLayoutsList) {
  // The flag: the text after the table, and under --json an "explain" array whose seconds
  // sum to the best layout's step.
  const std::string args =
      "plan --model megatron-1.7b --cluster dgx-a100 --gpus 8 --batch 64 --top 2 --explain";
  const auto text = mt::test::run_meshtrain(args);
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find("why the best layout takes"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("GEMM: MLP in"), std::string::npos);
  const auto r = mt::test::run_command("sh -c '" + std::string(MT_BINARY) + " " + args +
                                       " --json 2>/dev/null'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto js = nlohmann::json::parse(r.output);
  double total = 0;
  for (const auto& it : js.at("explain")) total += it.at("seconds").get<double>();
  const double step = js.at("layouts").at(0).at("step_time_s").get<double>();
  EXPECT_NEAR(total, step, kSumTol * step);
}

TEST(PlanExplain, SimulateDeepSpeed2021ShowsItsGathers) {
  // simulate --deepspeed-2021 costs Software::kDeepSpeed2021 (the library's step, to JSON's
  // rounding), says how, and lists the gathers beyond the compute as one item.
  const std::string args =
      "simulate --model gpt3-175b --cluster dgx-a100 --gpus 768 --batch 1536 --seq 2048 "
      "--dtype fp16 --microbatch 2 --zero 3 --recompute full --deepspeed-2021 --explain";
  const auto text = mt::test::run_meshtrain(args);
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find("ZeRO-3 gathers beyond compute"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("at 19.0 GB/s per GPU"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("67% of the parameters gathered again"), std::string::npos)
      << text.output;
  EXPECT_NE(text.output.find("DeepSpeed 2021"), std::string::npos) << text.output;
  const auto r = mt::test::run_command("sh -c '" + std::string(MT_BINARY) + " " + args +
                                       " --json 2>/dev/null'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const double step =
      nlohmann::json::parse(r.output).at("layouts").at(0).at("step_time_s").get<double>();
  Job j = gpt175b("dgx-a100", 768, 1536);
  j.dtype = "fp16";
  Layout l = layout(1, 1, 1, 768, Recompute::kFull, false, Software::kDeepSpeed2021);
  l.zero = 3, l.microbatch = 2;
  EXPECT_NEAR(step, estimate(j, l).step_time_s, 1e-6 * step);
}

}  // namespace
}  // namespace mt::plan

// The published test set (issue 30, item 4): every run in tests/plan/published_runs.json —
// papers, vendors' recipe tables and framework READMEs, each row with its source, its
// configuration and the figure the source reports — asked of the planner as the source ran
// it. Prints each row and the MAPE per source and overall. Rows marked "fitted" (Narayanan et
// al.'s Table 1: the A100 GEMM curve and memory-bound efficiency were chosen on it, see
// docs/planner.md "Calibration of the A100 curve") are listed and kept out of every MAPE;
// nothing else was fitted to any row.
//
// The error is on the step time: a throughput the source reports (TFLOP/s per GPU, tokens/s
// per GPU) is compared as published / predicted − 1, the step it implies over the step the
// planner predicts, both counted with the planner's FLOPs. Where a source leaves the virtual
// stages unsaid ("v": null) the row takes the planner's best v for its other settings.
//
// Run `build/release/published_runs_test` (or `ctest -R PublishedRuns -V`) for the table.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "plan/planner.h"

namespace mt::plan {
namespace {

using nlohmann::json;

json load_rows() {
  const std::string path = std::string(MT_SOURCE_DIR) + "/tests/plan/published_runs.json";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return json::parse(in);
}

// How the set is asked: as the presets stand (the default), with the H100's fused attention at
// cuDNN's published rates, or with every dgx-h100 row on dgx-h100-measured (kernel costs
// measured on a lent H100).
enum class H100 { kPreset, kCudnnAttention, kMeasured };

Job job_of(const json& r, H100 h100 = H100::kPreset) {
  Job j;
  j.model = model_preset(r.at("model").get<std::string>());
  if (r.contains("shape")) {
    const json& s = r.at("shape");
    auto set = [&](const char* key, auto& field) {
      if (s.contains(key)) field = s.at(key).get<std::remove_reference_t<decltype(field)>>();
    };
    set("n_layer", j.model.n_layer);
    set("n_head", j.model.n_head);
    set("n_kv_head", j.model.n_kv_head);
    set("d_model", j.model.d_model);
    set("d_ff", j.model.d_ff);
    set("vocab", j.model.vocab);
    set("swiglu", j.model.swiglu);
    set("bias", j.model.bias);
    set("tied", j.model.tied);
    set("dropout", j.model.dropout);
    set("learned_pos", j.model.learned_pos);
    set("n_experts", j.model.n_experts);
    set("top_k", j.model.top_k);
    set("d_ff_expert", j.model.d_ff_expert);
    if (s.contains("vocab")) j.model.vocab_real = 0;
    // A MoE preset's blocks are all MoE: as many as the row's layers.
    if (j.model.n_experts > 0) j.model.moe_layers = s.value("moe_layers", j.model.n_layer);
  }
  const bool on_h100 = r.at("cluster") == "dgx-h100";
  j.cluster =
      cluster_preset(on_h100 && h100 == H100::kMeasured ? std::string("dgx-h100-measured")
                                                        : r.at("cluster").get<std::string>());
  if (on_h100 && h100 == H100::kCudnnAttention) j.cluster.gpu.attention = h100_cudnn_attention();
  j.gpus = r.at("gpus").get<int64_t>();
  j.batch = r.at("batch").get<int64_t>();
  j.seq = r.at("seq").get<int64_t>();
  j.model.seq = j.seq;
  j.dtype = r.at("dtype").get<std::string>();
  j.expert_load = r.value("expert_load", 1.0);
  return j;
}

Software software_of(const std::string& s) {
  if (s == "megatron2021") return Software::kMegatron2021;
  if (s == "megatron2022") return Software::kMegatron2022;
  if (s == "deepspeed2021") return Software::kDeepSpeed2021;
  EXPECT_EQ(s, "today");
  return Software::kToday;
}

Layout layout_of(const json& r, int v) {
  Layout l;
  l.tp = r.at("tp").get<int>();
  l.pp = r.at("pp").get<int>();
  l.cp = r.value("cp", 1);
  l.ep = r.value("ep", 1);
  if (r.contains("cp_comm")) l.cp_comm = r.at("cp_comm").get<std::string>();
  l.dp = static_cast<int>(r.at("gpus").get<int64_t>() / (int64_t(l.tp) * l.pp * l.cp));
  l.virtual_stages = v;
  l.schedule = v > 1 ? "interleaved" : "1f1b";
  l.microbatch = r.at("microbatch").get<int64_t>();
  l.zero = r.at("zero").get<int>();
  l.recompute = parse_recompute(r.at("recompute").get<std::string>());
  l.sp = r.at("sp").get<bool>();
  set_software(l, software_of(r.at("software").get<std::string>()));
  l.tp_comm_overlap = r.value("tp_comm_overlap", false) && l.sp;
  if (r.contains("dp_overlap")) l.dp_overlap = r.at("dp_overlap").get<bool>();
  return l;
}

// "lighter_ends": k — the first and the last pipeline chunk hold k layers fewer than the
// others, all others equal (Llama 3 405B: "we reduce one Transformer layer each from the first
// and the last stages"; with a layer per chunk those two hold none). Empty where no such split
// exists for this v.
std::vector<int> lighter_ends_split(const json& r, int64_t n_layer, const Layout& l) {
  const int k = r.at("lighter_ends").get<int>();
  const int64_t chunks = int64_t(l.pp) * l.virtual_stages;
  const int64_t slots = n_layer + 2 * k;
  if (slots % chunks != 0 || slots / chunks < k) return {};
  std::vector<int> split(size_t(chunks), int(slots / chunks));
  split.front() -= k;
  split.back() -= k;
  return split;
}

// The row's estimate: its v, or the best v the planner finds where the source gives none
// (every v up to 16 that the software can split the layers into).
Estimate estimate_row(const json& r, H100 h100) {
  const Job j = job_of(r, h100);
  const bool ends = r.contains("lighter_ends");
  if (!r.at("v").is_null()) {
    Layout l = layout_of(r, r.at("v").get<int>());
    if (ends) l.pp_layers = lighter_ends_split(r, j.model.n_layer, l);
    return estimate(j, l);
  }
  std::optional<Estimate> best;
  for (int v = 1; v <= 16; ++v) {
    Layout l = layout_of(r, v);
    if (int64_t(l.pp) * v > j.model.n_layer) break;
    if (l.even_layers && j.model.n_layer % (int64_t(l.pp) * v) != 0) continue;
    if (ends) {
      l.pp_layers = lighter_ends_split(r, j.model.n_layer, l);
      if (l.pp_layers.empty()) continue;
    }
    if (invalid_reason(j, l)) continue;
    Estimate e = estimate(j, l);
    if (!best || e.step_time_s < best->step_time_s) best = std::move(e);
  }
  EXPECT_TRUE(best.has_value()) << r.at("where");
  return best.value_or(Estimate{});
}

// Published step time over predicted step time, minus one (see the top of the file).
double error_of(const json& r, const Estimate& e) {
  const std::string metric = r.at("metric").get<std::string>();
  const double pub = r.at("published").get<double>();
  if (metric == "step_s") return e.step_time_s / pub - 1;
  if (metric == "hw_tflops_per_gpu") return pub / e.hw_tflops_per_gpu - 1;
  if (metric == "model_tflops_per_gpu") return pub / e.tflops_per_gpu - 1;
  EXPECT_EQ(metric, "tokens_per_s_per_gpu");
  return pub / (e.tokens_per_s / r.at("gpus").get<double>()) - 1;
}

struct Tally {
  double sum = 0, worst = 0;
  int n = 0;
  void add(double err) {
    sum += std::abs(err);
    worst = std::max(worst, std::abs(err));
    ++n;
  }
  double mape() const { return n ? sum / n : 0; }
};

struct Result {
  std::map<std::string, Tally> by_source;
  Tally all;
  int rows_over_15 = 0;  // held-out rows whose error exceeds 15%
};

std::string goal_status(const Result& res);

Result run_all(bool print, H100 h100 = H100::kPreset) {
  const json data = load_rows();
  Result res;
  if (print)
    fmt::print("{:<16} {:<62} {:>10} {:>10} {:>7}\n", "source", "run", "published", "predicted",
               "error");
  for (const json& r : data.at("rows")) {
    const Estimate e = estimate_row(r, h100);
    const double err = error_of(r, e);
    const bool fitted = r.value("fitted", false);
    const std::string src = r.at("source").get<std::string>();
    if (!fitted) {
      res.by_source[src].add(err);
      res.all.add(err);
      if (std::abs(err) > 0.15) ++res.rows_over_15;
    }
    if (print) {
      const std::string metric = r.at("metric").get<std::string>();
      const double pred = metric == "step_s"              ? e.step_time_s
                          : metric == "hw_tflops_per_gpu" ? e.hw_tflops_per_gpu
                          : metric == "model_tflops_per_gpu"
                              ? e.tflops_per_gpu
                              : e.tokens_per_s / r.at("gpus").get<double>();
      std::string where = r.at("where").get<std::string>().substr(0, 62);
      fmt::print("{:<16} {:<62} {:>10.4g} {:>10.4g} {:>+6.1f}%{}{}\n", src, where,
                 r.at("published").get<double>(), pred, 100 * err,
                 r.at("v").is_null() ? fmt::format(" (v {})", e.layout.virtual_stages) : "",
                 fitted ? "  [fitted: not counted]" : "");
    }
  }
  if (print) {
    for (const auto& [src, t] : res.by_source)
      fmt::print("{:<16} {:>2} rows  MAPE {:>5.2f}%  worst {:>5.2f}%\n", src, t.n, 100 * t.mape(),
                 100 * t.worst);
    fmt::print(
        "all held-out    {:>2} rows  MAPE {:>5.2f}%  worst {:>5.2f}%  (issue 30's goal: "
        "<= 5%, no source > 8%, no row > 15%)\n",
        res.all.n, 100 * res.all.mape(), 100 * res.all.worst);
    fmt::print("issue 30's goal: {}\n", goal_status(res));
  }
  return res;
}

// Issue 30's goal for the set (MAPE <= 5% over all held-out rows, no source above 8%, no row
// above 15%): "met", or what misses it.
std::string goal_status(const Result& res) {
  std::string miss;
  auto add = [&](const std::string& what) { miss += (miss.empty() ? "" : "; ") + what; };
  if (res.all.mape() > 0.05) add(fmt::format("overall MAPE {:.2f}% > 5%", 100 * res.all.mape()));
  for (const auto& [src, t] : res.by_source)
    if (t.mape() > 0.08) add(fmt::format("{} {:.2f}% > 8%", src, 100 * t.mape()));
  if (res.rows_over_15 > 0)
    add(fmt::format("{} rows above 15% (worst {:.1f}%)", res.rows_over_15, 100 * res.all.worst));
  return miss.empty() ? "met" : "NOT met: " + miss;
}

TEST(PublishedRuns, EveryRowNamesItsSourceAndConfiguration) {
  const json data = load_rows();
  const json& sources = data.at("sources");
  std::set<std::string> held_out_sources;
  int held_out = 0;
  for (const json& r : data.at("rows")) {
    ASSERT_TRUE(sources.contains(r.at("source").get<std::string>())) << r.dump();
    for (const char* key :
         {"where", "model", "cluster", "gpus", "batch", "seq", "dtype", "tp", "pp", "v",
          "microbatch", "zero", "recompute", "sp", "software", "metric", "published"})
      ASSERT_TRUE(r.contains(key)) << key << " missing in " << r.dump();
    if (!r.value("fitted", false)) {
      ++held_out;
      held_out_sources.insert(r.at("source").get<std::string>());
    }
  }
  // Issue 30's floor for the set: 30 runs from 5 independent sources, none fitted.
  EXPECT_GE(held_out, 30);
  EXPECT_GE(held_out_sources.size(), 5u);
}

TEST(PublishedRuns, MapePerSourceAndOverall) {
  const Result res = run_all(true);
  // Each figure is held to issue 30's goal where the planner meets it, and elsewhere to what
  // was measured (a regression guard; the goal is printed above with what misses it, and in
  // docs/planner.md, "The published test set"): the MAPE per source and overall and the rows
  // above 15% measured on 2026-11-29 (sixteenth session: the cross-entropy's bytes as Megatron
  // moves them; before it, Meta's rows at the v and the CP they describe, DeepSpeed 2021's
  // gathers one module ahead beside the compute and regathered after the recompute;
  // docs/planner.md, "The published test set"), plus 0.5 percentage point of
  // slack for small model changes. Per source, so that one source cannot get worse behind
  // another's gain.
  constexpr double kSlack = 0.005, kGoalOverall = 0.05, kGoalSource = 0.08;
  const std::map<std::string, double> kMeasured = {
      {"korthikanti2022", 0.0324}, {"meta-llama3", 0.1358},       {"narayanan2021", 0.0528},
      {"nvidia-dgxc", 0.0318},     {"nvidia-dgxc-grok1", 0.0929}, {"torchtitan", 0.0087}};
  constexpr double kOverall = 0.0546;
  constexpr int kRowsOver15 = 1;
  auto bar = [&](double measured, double goal) {
    return measured <= goal ? std::min(goal, measured + kSlack) : measured + kSlack;
  };
  EXPECT_LE(res.all.mape(), bar(kOverall, kGoalOverall)) << goal_status(res);
  EXPECT_LE(res.rows_over_15, kRowsOver15) << goal_status(res);
  EXPECT_EQ(res.all.n, 47);
  ASSERT_EQ(res.by_source.size(), kMeasured.size());
  for (const auto& [src, measured] : kMeasured)
    EXPECT_LE(res.by_source.at(src).mape(), bar(measured, kGoalSource)) << src;
}

TEST(PublishedRuns, WithTheH100CudnnAttentionRates) {
  // The same set with the dgx-h100 preset's fused attention costed at cuDNN's published
  // rates (h100_cudnn_attention: FlashAttention-3 paper, Figures 5-6) instead of the GEMM
  // curve on the full T×T. Reported, not the default: docs/planner.md, "Kernel costs".
  const Result base = run_all(false), cudnn = run_all(true, H100::kCudnnAttention);
  // The kernel is faster than the curve says: every H100 row with fused attention speeds up.
  EXPECT_LT(cudnn.by_source.at("nvidia-dgxc").mape(), 1.0);
  EXPECT_NE(cudnn.all.mape(), base.all.mape());
}

TEST(PublishedRuns, WithTheMeasuredH100Kernels) {
  // Every dgx-h100 row on dgx-h100-measured: GEMM efficiency by shape, fused attention and
  // elementwise bandwidth as PyTorch reached them on a lent H100, times the measured fraction
  // of a burst rate kept under sustained load (0.874), and the measured launch floor
  // (docs/planner.md, "Kernel costs measured on an H100"). Reported beside the default: the
  // measured kernels leave the H100 rows uniformly optimistic — every NVIDIA recipe row
  // between -6% and -13% (2026-11-27) — where the estimated curve scores better by errors that
  // cancel (its attention on the full T×T is slow, its GEMMs fast). The uniform residual is
  // what the model lacks (communication kernels sharing the SMs, memory-bound kernels under
  // load), not a shape it gets wrong.
  const Result measured = run_all(true, H100::kMeasured);
  const json data = load_rows();
  for (const json& r : data.at("rows")) {
    if (r.at("source") != "nvidia-dgxc") continue;
    const double err = error_of(r, estimate_row(r, H100::kMeasured));
    EXPECT_LT(err, -0.04) << r.at("where") << ": the measured kernels are optimistic";
    EXPECT_GT(err, -0.15) << r.at("where") << ": by the uniform residual only";
  }
  // A regression guard on the figures measured on 2026-11-27 (Grok-1's on 2026-11-29, with
  // expert tp; Meta's on 2026-11-29 at the v and the CP Meta describe), plus 0.5 point of
  // slack.
  EXPECT_LE(measured.by_source.at("nvidia-dgxc").mape(), 0.0974 + 0.005);
  EXPECT_LE(measured.by_source.at("nvidia-dgxc-grok1").mape(), 0.1102 + 0.005);
  EXPECT_LE(measured.by_source.at("meta-llama3").mape(), 0.2042 + 0.005);
}

TEST(PublishedRuns, MetaLlama3ByVirtualStages) {
  // Meta's rows run v 8, a layer per chunk, as Meta describe their split (the first chunk the
  // embedding alone, the last the head alone). Printed here for every v their layout can
  // split into with the ends one layer lighter (issue 30 item 2; docs/planner.md "The
  // published test set"): the error and the planner's memory per GPU. The published figure
  // lies within what the planner predicts for Meta's layout over those v (slower at the
  // fewest chunks, faster at the most): the gap is what the model leaves out, not a layout
  // the planner cannot reach.
  const json data = load_rows();
  for (const json& r : data.at("rows")) {
    if (r.at("source") != "meta-llama3") continue;
    const Job j = job_of(r);
    double lo = 1e300, hi = -1e300;
    for (int v = 1; v <= 16; ++v) {
      Layout l = layout_of(r, v);
      if (int64_t(l.pp) * v > j.model.n_layer + 2) break;
      l.pp_layers = lighter_ends_split(r, j.model.n_layer, l);
      if (l.pp_layers.empty() || invalid_reason(j, l)) continue;
      const Estimate e = estimate(j, l);
      const double err = error_of(r, e);
      lo = std::min(lo, err), hi = std::max(hi, err);
      fmt::print("{:<40} v {:>2}: {:>6.1f} TFLOP/s  error {:>+6.1f}%  memory {:>6.1f} GB{}\n",
                 r.at("where").get<std::string>().substr(0, 40), v, e.tflops_per_gpu, 100 * err,
                 e.memory.total() / 1e9,
                 e.memory.total() > memory_per_rank(j) ? " (does not fit)" : "");
    }
    EXPECT_LT(lo, 0.0) << r.at("where");
    EXPECT_GT(hi, 0.0) << r.at("where");
  }
}

}  // namespace
}  // namespace mt::plan

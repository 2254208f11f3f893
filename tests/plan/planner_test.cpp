// The planner against published numbers: the 175B memory walkthrough, the ZeRO paper's
// 7.5B example, Narayanan et al. 2021 Table 1 (throughput within MAPE <= 5%, no row over
// 10%; the search ranks the paper's (T, P) in its top 3), and the search's speed.
#include "plan/planner.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>

#include "plan/kernels.h"

namespace mt::plan {
namespace {

// Narayanan et al. 2021 Table 1 (model, T, P, GPUs, batch, achieved TFLOP/s per GPU) and
// the microbatch size and layers per virtual stage of Megatron-LM's
// examples/sc21/run_table_1.sh (v = layers / pp / that; 1 where it sets none).
struct Row {
  const char* model;
  int tp, pp, gpus;
  int64_t batch, microbatch;
  int v;
  double published_tflops;
  bool local_ddp;  // DDP=local in the script: gradients reduced after backward
};
const Row kTable1[] = {
    {"megatron-1.7b", 1, 1, 32, 512, 16, 1, 137, false},
    {"megatron-3.6b", 2, 1, 64, 512, 16, 1, 138, false},
    {"megatron-7.5b", 4, 1, 128, 512, 16, 1, 142, false},
    {"megatron-18b", 8, 1, 256, 1024, 8, 1, 135, false},
    {"megatron-39b", 8, 2, 512, 1536, 4, 1, 138, true},
    {"megatron-76b", 8, 4, 1024, 1792, 2, 3, 140, true},
    {"megatron-145b", 8, 8, 1536, 2304, 2, 2, 148, true},
    {"megatron-310b", 8, 16, 1920, 2160, 1, 2, 155, true},
    {"megatron-530b", 8, 35, 2520, 2520, 1, 3, 163, true},
    {"megatron-1t", 8, 64, 3072, 3072, 1, 1, 163, true},
};

Job table1_job(const Row& r) {
  Job j;
  j.model = model_preset(r.model);
  j.cluster = cluster_preset("dgx-a100");
  j.gpus = r.gpus;
  j.batch = r.batch;
  j.seq = 2048;
  j.dtype = "fp16";
  return j;
}

Layout table1_layout(const Row& r) {
  Layout l;
  l.tp = r.tp;
  l.pp = r.pp;
  l.dp = r.gpus / (r.tp * r.pp);
  l.microbatch = r.microbatch;
  l.virtual_stages = r.v;
  l.schedule = r.v > 1 ? "interleaved" : "1f1b";
  l.recompute = Recompute::kFull;
  // 2021: backward's TP all-reduces after the weight gradients, unfused attention, blocking
  // p2p, n_layer / (pp·v) layers per chunk; the reduction as run_table_1.sh's DDP says.
  set_software(l, Software::kMegatron2021);
  l.dp_overlap = !r.local_ddp;
  return l;
}

TEST(PlanHardware, JsonPresetsEqualTheEmbeddedOnes) {
  // plan/presets/*.json are the embedded presets written out; a cluster file in that format
  // is what --cluster FILE reads.
  for (const char* name : {"dgx-a100", "dgx-h100", "hgx-b200"}) {
    const std::string path = std::string(MT_SOURCE_DIR) + "/plan/presets/" + name + ".json";
    EXPECT_EQ(to_json(cluster_preset(path)), to_json(cluster_preset(name))) << path;
  }
}

TEST(PlanMemory, Gpt175bWalkthrough) {
  // 175B on 1,024 A100s, T=8, P=16, D=8, no ZeRO: per GPU 2.7 GB parameters, 2.7 GB
  // gradients, 16.4 GB Adam (fp32 master + moments) — the mean over the 16 stages
  // (Ψ/(T·P) with Ψ = 174.6B). fp16 mixed precision, as GPT-3-era Megatron trained it.
  Job j;
  j.dtype = "fp16";
  j.model = model_preset("gpt3-175b");
  j.cluster = cluster_preset("dgx-a100");
  j.gpus = 1024;
  j.batch = 1024;
  j.seq = 2048;
  const double psi = j.model.total_params();
  EXPECT_NEAR(psi / 1e9, 174.6, 0.1);
  MemoryBytes mean = zero_model_states(psi / (8 * 16), 8, 0, "fp16");
  fmt::print("175B mean per GPU: params {:.2f} GB, grads {:.2f} GB, Adam {:.2f} GB\n",
             mean.parameters / 1e9, mean.gradients / 1e9, mean.optimizer / 1e9);
  EXPECT_NEAR(mean.parameters / 1e9, 2.7, 0.05);
  EXPECT_NEAR(mean.gradients / 1e9, 2.7, 0.05);
  EXPECT_NEAR(mean.optimizer / 1e9, 16.4, 0.05);
  // bf16 keeps and reduces gradients in fp32 (Megatron-LM's default for bf16): 5.5 GB.
  EXPECT_NEAR(zero_model_states(psi / (8 * 16), 8, 0, "bf16").gradients / 1e9, 5.46, 0.05);
  // The planner's worst stage (stage 0: 6 blocks plus the vocab-parallel embedding).
  Layout l;
  l.tp = 8, l.pp = 16, l.dp = 8, l.microbatch = 1, l.recompute = Recompute::kFull;
  int worst = -1;
  MemoryBytes m = memory_per_gpu(j, l, &worst);
  fmt::print(
      "175B worst stage {}: params {:.2f} GB, grads {:.2f} GB, Adam {:.2f} GB, "
      "activations {:.2f} GB\n",
      worst, m.parameters / 1e9, m.gradients / 1e9, m.optimizer / 1e9, m.activations / 1e9);
  EXPECT_NEAR(m.parameters / 1e9, 2.9, 0.1);
  EXPECT_NEAR(m.optimizer / 1e9, 17.55, 0.1);
}

TEST(PlanMemory, ZeroPaper7p5bOn64Gpus) {
  // Rajbhandari et al. 2020, §5 / Figure 1: Ψ = 7.5B, N_d = 64, K = 12: baseline 120 GB,
  // stage 1 31.4 GB, stage 2 16.6 GB, stage 3 1.9 GB.
  const double psi = 7.5e9;
  const double expect[] = {120.0, 31.4, 16.6, 1.9};
  for (int z = 0; z <= 3; ++z) {
    const double gb = zero_model_states(psi, 64, z, "fp16").total() / 1e9;
    fmt::print("ZeRO-{} 7.5B on 64: {:.2f} GB (paper {})\n", z, gb, expect[z]);
    EXPECT_NEAR(gb, expect[z], 0.05) << "stage " << z;
  }
}

TEST(PlanTime, NarayananTable1) {
  double sum_ape = 0, worst = 0;
  fmt::print("{:<15} {:>3} {:>3} {:>5} {:>5} {:>4} {:>2} {:>9} {:>9} {:>7} {:>7} {:>6}\n", "model",
             "T", "P", "GPUs", "batch", "mb", "v", "published", "predicted", "error", "bubble",
             "mem GB");
  for (const Row& r : kTable1) {
    const Job j = table1_job(r);
    const Estimate e = estimate(j, table1_layout(r));
    const double ape = std::abs(e.hw_tflops_per_gpu - r.published_tflops) / r.published_tflops;
    sum_ape += ape;
    worst = std::max(worst, ape);
    fmt::print(
        "{:<15} {:>3} {:>3} {:>5} {:>5} {:>4} {:>2} {:>9.0f} {:>9.1f} {:>6.1f}% {:>7.3f} "
        "{:>6.1f}\n",
        r.model, r.tp, r.pp, r.gpus, r.batch, r.microbatch, r.v, r.published_tflops,
        e.hw_tflops_per_gpu, 100 * (e.hw_tflops_per_gpu / r.published_tflops - 1),
        e.bubble_fraction, e.memory.total() / 1e9);
    EXPECT_LT(e.memory.total(), j.cluster.gpu.hbm_bytes) << r.model;
  }
  const double mape = sum_ape / std::size(kTable1);
  fmt::print("MAPE {:.2f}%, worst row {:.2f}%\n", 100 * mape, 100 * worst);
  EXPECT_LE(mape, 0.05);   // the bar
  EXPECT_LE(worst, 0.10);  // no row over 10%
}

// Megatron-LM 2021 had no gradient accumulation fusion: every microbatch's backward wrote
// a temporary fp16 weight gradient that an elementwise add folded into the accumulation
// buffer (2 bytes read, 2 read and 2 written per parameter). Under torch DDP (pp = 1) the
// first gradient becomes .grad as it is; DDP=local adds every one into main_grad.
// A Table 1 row as 2021 ran it (unfused) and the same layout with the fusion on.
struct FusedAndUnfused {
  Job job;
  Estimate unfused, fused;
};
FusedAndUnfused fused_and_unfused(const Row& r) {
  FusedAndUnfused out{table1_job(r), {}, {}};
  Layout l = table1_layout(r);
  out.unfused = estimate(out.job, l);
  l.grad_accum_fusion = true;
  out.fused = estimate(out.job, l);
  return out;
}

TEST(PlanTime, UnfusedGradientAccumulationAddsEveryMicrobatchsGradient) {
  const double hbm = 2.039e12 * 0.7;  // the dgx-a100 preset's HBM rate for memory-bound work
  {
    // 18B, T 8, P 1, mb 8: 1024 / 32 / 8 = 4 microbatches
    const auto [j, unfused, fused] = fused_and_unfused(kTable1[3]);
    const ModelSpec& m = j.model;
    const double psi = double(m.n_layer) * m.block_params_per_tp(8) + m.embedding_params_per_tp(8) +
                       m.head_params_per_tp(8);
    ASSERT_EQ(unfused.microbatches, 4);
    const double adds_s = 3 * psi * 6 / hbm;
    EXPECT_NEAR(unfused.grad_accum_s, adds_s, 1e-9 * adds_s);
    EXPECT_EQ(fused.grad_accum_s, 0.0);
    // Nothing else changes: the step grows by exactly the adds.
    EXPECT_NEAR(unfused.step_time_s - fused.step_time_s, adds_s, 1e-9 * adds_s);
  }
  {
    // 39B, T 8, P 2, mb 4, DDP=local: 12 microbatches, all added
    const auto [j, unfused, fused] = fused_and_unfused(kTable1[4]);
    const ModelSpec& m = j.model;
    const double block = m.block_params_per_tp(8), layers = double(m.n_layer) / 2;
    // Stage 0 holds the embedding; stage 1 the head and the tied embedding's copy.
    const double first = layers * block + m.embedding_params_per_tp(8);
    const double last = layers * block + m.head_params_per_tp(8) + double(m.vocab) * m.d_model / 8;
    ASSERT_EQ(unfused.microbatches, 12);
    // The busiest rank's: the last, with the head's GEMMs (the first holds the position
    // embedding too, so more parameters).
    ASSERT_EQ(unfused.busiest_rank, 1);
    EXPECT_NEAR(unfused.grad_accum_s, 12 * last * 6 / hbm, 1e-9);
    // 1F1B's critical path runs through at least one stage's 12 backwards.
    EXPECT_GE(unfused.step_time_s - fused.step_time_s,
              12 * std::min(first, last) * 6 / hbm * (1 - 1e-9));
  }
}

// time_s.grad_accum is the busiest rank's adds, like its forward and backward: with
// --pp-layers 8,4 on gpt2-124m the first stage holds the most parameters (8 blocks and the
// embedding) but the last, with the LM head's GEMMs (~5 blocks' worth), computes the most.
TEST(PlanTime, GradientAccumulationIsTheBusiestRanks) {
  Job j;
  j.model = model_preset("gpt2-124m");
  j.cluster = cluster_preset("dgx-a100");
  j.gpus = 2;
  j.batch = 16;
  j.seq = 1024;
  j.dtype = "fp16";
  Layout l;
  l.pp = 2;
  l.microbatch = 2;
  l.pp_layers = {8, 4};
  l.grad_accum_fusion = false;
  const Estimate e = estimate(j, l);
  const ModelSpec& m = j.model;
  const double block = m.block_params_per_tp(1);
  const double first = 8 * block + m.embedding_params_per_tp(1);
  const double last = 4 * block + m.head_params_per_tp(1) + double(m.vocab) * m.d_model;
  ASSERT_GT(first, last);  // so the most parameters would be the wrong rank's
  ASSERT_EQ(e.busiest_rank, 1);
  ASSERT_EQ(e.microbatches, 8);
  const double hbm = 2.039e12 * 0.7;
  EXPECT_NEAR(e.grad_accum_s, 8 * last * 6 / hbm, 1e-9 * e.grad_accum_s);
}

// Narayanan et al. 2021 Figures 13-15 plot 64-GPU sweeps without a table; the model must at
// least move the way the measurements do (settings of Megatron-LM's examples/sc21
// run_figure_1{3,4,5}.sh: microbatch 1, full recomputation, DDP=local, fp16).
TEST(PlanTime, NarayananFigures13To15Directions) {
  auto hw = [](int64_t layers, int64_t hidden, int64_t heads, int64_t batch, int tp, int pp) {
    Job j;
    j.model = model_preset("megatron-1t");
    j.model.n_layer = layers;
    j.model.d_model = hidden;
    j.model.d_ff = 4 * hidden;
    j.model.n_head = j.model.n_kv_head = heads;
    j.cluster = cluster_preset("dgx-a100");
    j.gpus = 64;
    j.batch = batch;
    j.seq = 2048;
    j.dtype = "fp16";
    Layout l;
    l.tp = tp;
    l.pp = pp;
    l.dp = 64 / (tp * pp);
    l.microbatch = 1;
    l.recompute = Recompute::kFull;
    set_software(l, Software::kMegatron2021);
    return estimate(j, l).hw_tflops_per_gpu;
  };
  // Fig. 13: T x P = 64 on a 162B-like model: T = 8 (a node) beats T = 4 and T = 2.
  for (int64_t batch : {32, 128}) {
    SCOPED_TRACE(batch);
    const double t2 = hw(32, 20480, 128, batch, 2, 32), t4 = hw(32, 20480, 128, batch, 4, 16),
                 t8 = hw(32, 20480, 128, batch, 8, 8);
    EXPECT_GT(t8, t4);
    EXPECT_GT(t4, t2);
  }
  // Fig. 14: P x D = 64 (T = 1): throughput falls as P grows.
  double prev = 1e30;
  for (int pp : {2, 4, 8, 16, 32}) {
    const double v = hw(32, 3840, 32, 512, 1, pp);
    EXPECT_LT(v, prev) << "pp " << pp;
    prev = v;
  }
  // Fig. 15: T x D = 64 (P = 1): throughput falls as T grows.
  for (int64_t batch : {32, 128, 512}) {
    SCOPED_TRACE(batch);
    EXPECT_GT(hw(32, 3840, 32, batch, 2, 1), hw(32, 3840, 32, batch, 4, 1));
    EXPECT_GT(hw(32, 3840, 32, batch, 4, 1), hw(32, 3840, 32, batch, 8, 1));
  }
}

// The largest search: Llama 3 405B on 16,384 H100s, batch 2048 x seq 8192.
Job llama405b_on_16k_h100() {
  Job j;
  j.model = model_preset("llama3-405b");
  j.cluster = cluster_preset("dgx-h100");
  j.gpus = 16384;
  j.batch = 2048;
  j.seq = 8192;
  return j;
}

TEST(PlanSearch, InterleavesUnevenLayerCountsBeyondMegatron2021) {
  // Llama 3 405B has 126 layers: no v > 1 splits them evenly over 16 stages, yet our
  // partition (and today's Megatron-LM) runs such pipelines; 2021's could not.
  const Job j = llama405b_on_16k_h100();
  SearchPins pins;
  pins.tp = 8;
  pins.pp = 16;
  pins.microbatch = 1;
  pins.recompute = Recompute::kFull;
  auto uneven_interleaved = [&](const SearchResult& s) {
    int n = 0;
    for (const Estimate& e : s.top)
      n += e.layout.virtual_stages > 1 && 126 % (16 * e.layout.virtual_stages) != 0;
    return n;
  };
  EXPECT_GT(uneven_interleaved(search(j, pins, 50)), 0);
  pins.megatron_2021 = true;
  EXPECT_EQ(uneven_interleaved(search(j, pins, 50)), 0);
}

Job job_of(const char* model, const char* cluster, int64_t gpus, int64_t batch) {
  Job j;
  j.model = model_preset(model);
  j.cluster = cluster_preset(cluster);
  j.gpus = gpus;
  j.batch = batch;
  j.seq = j.model.seq;
  return j;
}

TEST(PlanSearch, CoversEveryPipelineDepthAndMicrobatchSize) {
  // Depths that neither divide n_layer nor are powers of two, and microbatch sizes that are
  // not powers of two, were never tried: these jobs found nothing, or a slower layout.
  struct Case {
    const char* model;
    const char* cluster;
    int64_t gpus, batch;
    int pp;  // a depth the search must now find (the only ones that divide the job)
  };
  const Case cases[] = {{"megatron-18b", "dgx-a100", 96, 512, 3},  // 40 layers; pp 3: dp 16
                        {"llama3-8b", "dgx-h100", 12, 64, 3},      // 32 layers
                        {"llama3-8b", "dgx-h100", 13, 64, 13}};    // 13 GPUs: pp 13 or dp 13
  for (const Case& c : cases) {
    SCOPED_TRACE(fmt::format("{} on {}", c.model, c.gpus));
    const SearchResult s = search(job_of(c.model, c.cluster, c.gpus, c.batch), SearchPins{}, 50);
    ASSERT_FALSE(s.top.empty());
    bool found = false;
    for (const Estimate& e : s.top) found |= e.layout.pp == c.pp;
    EXPECT_TRUE(found);
  }
  // GPT-2 124M, batch 24 on 8 GPUs: 3 sequences per replica, one microbatch of 3 is faster
  // than three of 1 (the best before).
  const Job j = job_of("gpt2-124m", "dgx-h100", 8, 24);
  const SearchResult s = search(j, SearchPins{}, 1);
  ASSERT_EQ(s.top.size(), 1u);
  EXPECT_EQ(s.top[0].layout.microbatch, 3);
  SearchPins mb1;
  mb1.microbatch = 1;
  EXPECT_LT(s.top[0].step_time_s, search(j, mb1, 1).top.at(0).step_time_s);
  // Megatron-LM 2021 needed pp | n_layer: 40 layers on 96 GPUs at batch 512 have no layout.
  SearchPins old;
  old.megatron_2021 = true;
  const SearchResult none = search(job_of("megatron-18b", "dgx-a100", 96, 512), old, 1);
  EXPECT_TRUE(none.top.empty());
  EXPECT_EQ(none.fit, 0);
}

// Distinct (T, P) pairs of a search, best first, with the best estimate of each.
std::vector<Estimate> best_per_tp_pp(const SearchResult& s) {
  std::vector<Estimate> out;
  for (const Estimate& e : s.top) {
    bool seen = false;
    for (const Estimate& o : out) seen |= o.layout.tp == e.layout.tp && o.layout.pp == e.layout.pp;
    if (!seen) out.push_back(e);
  }
  return out;
}

void print_breakdown(const char* what, const Estimate& e) {
  const auto& l = e.layout;
  fmt::print(
      "  {:<6} T{} P{} D{} v{} mb{} m{}: step {:.2f} s = pipeline {:.2f} (fwd {:.2f} bwd {:.2f}, "
      "of which TP {:.2f}; gradient accumulation {:.2f}; p2p {:.2f}; bubble {:.1f}%) + DP "
      "exposed {:.2f} + optimizer {:.2f}; {:.1f} GB\n",
      what, l.tp, l.pp, l.dp, l.virtual_stages, l.microbatch, e.microbatches, e.step_time_s,
      e.pipeline_s, e.forward_s, e.backward_s, e.tp_comm_s, e.grad_accum_s, e.pp_comm_s,
      100 * e.bubble_fraction, e.dp_exposed_s, e.optimizer_s, e.memory.total() / 1e9);
}

TEST(PlanSearch, Table1TensorPipelineInTopThree) {
  // Given each row's model, GPU count and batch (fp16, seq 2048, full recomputation as the
  // paper ran) and only what Megatron-LM could do in 2021 (SearchPins::megatron_2021: no
  // ZeRO, no SP, pp divides n_layer, interleaving with pp > 2, gradients reduced after the
  // flush when pp > 1), the search over T, P, v and the microbatch ranks the paper's (T, P)
  // among its top 3 distinct (T, P) pairs. 18B and 39B do not: the model finds T = 2 with an
  // interleaved pipeline 13-16% faster than T = 8, from the 2021 tensor parallelism's
  // replicated layer-norm/dropout traffic and all-reduces (docs/planner.md, "Search vs the
  // paper's (T, P)"); the test pins exactly those two as the known misses.
  const std::set<std::string> known_misses = {"megatron-18b", "megatron-39b"};
  int in_top3 = 0;
  for (const Row& r : kTable1) {
    SearchPins pins;
    pins.megatron_2021 = true;
    pins.recompute = Recompute::kFull;
    const Job j = table1_job(r);
    const SearchResult s = search(j, pins, 400);
    const std::vector<Estimate> pairs = best_per_tp_pp(s);
    int rank = 0;
    for (size_t i = 0; i < pairs.size() && !rank; ++i)
      if (pairs[i].layout.tp == r.tp && pairs[i].layout.pp == r.pp) rank = int(i) + 1;
    std::string got;
    for (size_t i = 0; i < std::min<size_t>(3, pairs.size()); ++i)
      got += fmt::format(" ({},{}) {:.2f}s", pairs[i].layout.tp, pairs[i].layout.pp,
                         pairs[i].step_time_s);
    fmt::print("{:<15} paper ({},{}) rank {} of {} | top:{}  [{:.2f} s, {} layouts]\n", r.model,
               r.tp, r.pp, rank, pairs.size(), got, s.search_s, s.considered);
    const bool ok = rank >= 1 && rank <= 3;
    if (!ok) {
      print_breakdown("best", pairs.front());
      if (rank) print_breakdown("paper", pairs[size_t(rank - 1)]);
    }
    in_top3 += ok;
    EXPECT_EQ(ok, !known_misses.count(r.model)) << r.model << " rank " << rank;
  }
  fmt::print("paper's (T, P) in the top 3: {} of 10 rows\n", in_top3);
  // A regression pin of the planner's own output, and the only backing of README's "8 of 10
  // Table 1 rows rank the paper's layout in the top 3" (docs/claims.md): what it proves is
  // that the ranking has not changed, not that 8 is right; a change of the cost model that
  // moves it must say why in docs/planner.md.
  EXPECT_EQ(in_top3, 8);
}

// The speed bar (under 5 s for this search) is measured by bench/plan, not here:
// tests do not assert on time. What keeps the search fast is exact and tested: memory is
// checked before any replay, and only the layouts that fit are replayed (fewer, when the
// lower bound prunes).
TEST(PlanSearch, SixteenThousandGpusReplaysOnlyWhatFits) {
  const Job j = llama405b_on_16k_h100();
  const SearchResult s = search(j, SearchPins{}, 10);
  fmt::print("16,384 GPUs: {} layouts, {} fit, {} replayed, {:.2f} s\n", s.considered, s.fit,
             s.replayed, s.search_s);
  ASSERT_FALSE(s.top.empty());
  // Regression pins of the search's counters (docs/claims.md): they catch a change of what is
  // enumerated or of the memory model, not a wrong count; the time bar is bench/plan's.
  EXPECT_EQ(s.considered, 8616);
  EXPECT_EQ(s.fit, 77);
  EXPECT_LE(s.replayed, s.fit);
}

// Software::kDeepSpeed2021 (the ZeRO-3 rows of Narayanan et al. Table 2): ZeRO-3's collectives
// at kDeepSpeed2021Zero3BytesPerS per GPU whatever the link, beside the compute (the next
// module's gather during this one's), and under full recomputation the modules whose
// parameters are reused more than kDeepSpeed2021MaxReuseDistance parameters later gathered a
// third time. Exact but for rounding: the replay adds the same terms.
TEST(PlanTime, DeepSpeed2021Zero3GathersBesideTheComputeAtTheirRate) {
  Job j;
  j.model = model_preset("gpt3-175b");
  j.cluster = cluster_preset("dgx-a100");
  j.gpus = 1536;
  j.batch = 1536;
  j.seq = j.model.seq = 2048;
  j.dtype = "fp16";
  Layout l;
  l.dp = 1536;
  l.microbatch = 1;
  l.zero = 3;
  l.recompute = Recompute::kFull;
  set_software(l, Software::kDeepSpeed2021);
  EXPECT_NEAR(kDeepSpeed2021Zero3BytesPerS, 18.99e9, 0.01e9);  // 7/8 of 10.2 GB in 0.47 s
  // h = 12288: after its recompute, MLP out's backward follows at once (kept); MLP in's comes
  // after MLP out's recompute and backward, 2 · 4h² = 1.2e9 parameters later (gathered again),
  // and so the projection and QKV: 8h² of the block's 12h².
  const double f = regathered_fraction(j, l);
  EXPECT_NEAR(f, 8.0 / 12, 1e-12);
  Layout no_recompute = l;
  no_recompute.recompute = Recompute::kSelective;
  const Estimate ds = estimate(j, l);
  // One sequence per GPU: the gathers outlast every pass's compute, so each pass takes its
  // collectives' time: forward one gather, backward 1 + f gathers and the reduce-scatter, of
  // (n - 1)/n of the model's fp16 parameters and gradients (2 bytes each).
  const double psi = double(j.model.n_layer) * j.model.block_params_per_tp(1) +
                     j.model.embedding_params_per_tp(1) + j.model.head_params_per_tp(1);
  const double n = 1536, one = 2 * psi * (n - 1) / n / kDeepSpeed2021Zero3BytesPerS;
  EXPECT_NEAR(ds.pipeline_s, double(ds.microbatches) * (3 + f) * one, 1e-9 * ds.pipeline_s);
  Layout free_comm = l;
  free_comm.z3_bytes_per_s = 1e300;
  EXPECT_LT(estimate(j, free_comm).pipeline_s, 0.5 * ds.pipeline_s);  // the compute is hidden
  // A module small enough to be reused within the distance is not gathered again: 1.7B's
  // block (h 2304, 6.4e7 parameters) keeps every module from its recompute to its backward.
  Job small = j;
  small.model = model_preset("megatron-1.7b");
  EXPECT_EQ(regathered_fraction(small, l), 0.0);
  // Other software gathers a block once for its recompute and its backward (FSDP, ours).
  Layout today = l;
  set_software(today, Software::kToday);
  EXPECT_EQ(regathered_fraction(j, today), 0.0);
  // Four sequences per GPU (384 GPUs): the gathers are prefetched one module ahead, beside
  // the compute between two modules' hooks (z3_module_prefetch), so the forward of a block is
  // max(QKV + attention, gather of the projection) + max(projection + half the norms and
  // adds, gather of MLP in) + max(MLP in + GELU, gather of MLP out) + max(MLP out + the other
  // half, gather of the next QKV), not the longer of the sums: the projection's short compute
  // cannot hide MLP in's long gather.
  j.gpus = 384;
  l.dp = 384, l.microbatch = 4;
  const Estimate four = estimate(j, l);
  const LayerKernels k = layer_kernels(j, l, 1.0);
  const Z3Modules z = z3_modules(j, l);
  const double s4 = 2 * (384.0 - 1) / 384 / kDeepSpeed2021Zero3BytesPerS;  // per parameter
  const double seg[4] = {
      four.layer_forward_s - (k.proj + k.norm_residual + k.mlp_in + k.activation + k.mlp_out),
      k.proj + k.norm_residual / 2, k.mlp_in + k.activation, k.mlp_out + k.norm_residual / 2};
  double walk = 0, compute = 0, gathers = 0;
  for (int i = 0; i < 4; ++i) {
    walk += std::max(seg[i], z.params[(i + 1) % 4] * s4);
    compute += seg[i], gathers += z.params[i] * s4;
  }
  EXPECT_GT(walk, 1.05 * std::max(compute, gathers));  // the misaligned modules cost
  fmt::print("175B, 4 sequences per GPU: a block's forward {:.1f} ms, the longer sum {:.1f} ms\n",
             1e3 * walk, 1e3 * std::max(compute, gathers));
  // The forward pass: its 96 blocks' walk, and the embedding and head (under 1%) beside it.
  EXPECT_GT(four.forward_s, 96 * walk);
  EXPECT_LT(four.forward_s, 96 * walk * 1.01);
  // Thirty-two sequences per GPU (48 GPUs): every module's compute outlasts the next gather,
  // so the step is the same layout's with free communication.
  j.gpus = 48;
  l.dp = free_comm.dp = 48, l.microbatch = free_comm.microbatch = 32;
  EXPECT_NEAR(estimate(j, l).step_time_s, estimate(j, free_comm).step_time_s,
              1e-9 * estimate(j, l).step_time_s);
}

TEST(PlanTime, BlockingP2pWaitsInLockStepExchanges) {
  // 18B on 256 A100s as T 2 x P 4 x v 5, mb 2, the 2021 software: its p2p blocks as NCCL's
  // rendezvous over Megatron-LM's batched exchanges (pp::replay_rendezvous). Against the same
  // layout with the transfers overlapped on their own stream (Megatron-Core's
  // overlap_p2p_comm: asynchronous sends):
  const Row r{"megatron-18b", 2, 4, 256, 1024, 2, 5, 135, true};
  const Job j = table1_job(r);
  const Layout blocking = table1_layout(r);
  Layout overlapped = blocking;
  overlapped.pp_overlap = true;
  const Estimate b = estimate(j, blocking, true), o = estimate(j, overlapped, true);
  // - every compute action takes the same time: the transfers are not charged as compute;
  ASSERT_EQ(b.replay.spans.size(), o.replay.spans.size());
  for (size_t k = 0; k < b.replay.spans.size(); ++k) {
    ASSERT_EQ(b.replay.spans[k].size(), o.replay.spans[k].size());
    for (size_t i = 0; i < b.replay.spans[k].size(); ++i) {
      const PipeSpan &x = b.replay.spans[k][i], &y = o.replay.spans[k][i];
      EXPECT_EQ(x.action, y.action);
      EXPECT_NEAR(x.end_s - x.start_s, y.end_s - y.start_s, 1e-12);
    }
  }
  // - the ranks wait in the exchanges: a middle rank's steps each carry their messages one
  //   after another (2·m·v transfers in all, pp_comm_s), on top of its compute;
  ASSERT_GT(b.pp_comm_s, 0);
  for (int k = 1; k + 1 < blocking.pp; ++k)
    EXPECT_GE(b.pipeline_s, b.replay.busy_s[size_t(k)] + b.pp_comm_s - 1e-9) << "rank " << k;
  // - so the blocking pipeline is slower; the overlapped one only delays each receiver.
  EXPECT_GT(b.pipeline_s, o.pipeline_s + 0.5 * b.pp_comm_s);
}

}  // namespace
}  // namespace mt::plan

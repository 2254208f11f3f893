// The planner's memory model against the runtime's accounting allocator (DESIGN.md idea 6):
// for the small layouts the runtime tests use (DP/ZeRO, TP/SP, 1F1B, GPipe, interleaved,
// zero-bubble, full and selective recomputation, a head heavy enough that train splits the
// layers 7,1), the predicted per-rank peak (f32, our runtime's formulas) equals the peak
// `meshtrain train` measures. The bar is 5%; the test holds 0.1%: every case is equal
// to the byte except ZeRO-1 with SP (+0.07%: the SP gradient sync packs only the shard's part
// of the layer norms, which the planner counts whole).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/config.h"
#include "plan/planner.h"
#include "test_util.h"

namespace mt::plan {
namespace {

struct Case {
  int dp, zero;
  int64_t batch, microbatch;
  int pp = 1;
  const char* schedule = "1f1b";
  int tp = 1;
  bool sp = false;
  int64_t layers = 0;  // 0: 4 with pipelining, else 2
  int64_t vocab = 0;   // 0: the preset's
  const char* recompute = "none";
  int virtual_stages = 1;
  int cp = 1;
  const char* cp_comm = "ring";
  int64_t seq = 32;     // from 1024 (and with cp) the runtime runs the blockwise attention kernel
  int64_t experts = 0;  // MoE: --moe-experts (top 2) in every block
  int ep = 1;

  int ranks() const { return dp * pp * tp * cp; }
  int64_t n_layer() const { return layers ? layers : pp > 1 ? 4 : 2; }
  std::string name() const {
    return fmt::format("dp {} zero {} pp {} {} v {} tp {}{} microbatch {} recompute {}{}{}{}{}", dp,
                       zero, pp, schedule, virtual_stages, tp, sp ? " sp" : "", microbatch,
                       recompute, vocab ? fmt::format(" vocab {}", vocab) : "",
                       cp > 1 ? fmt::format(" cp {} {}", cp, cp_comm) : "",
                       seq != 32 ? fmt::format(" seq {}", seq) : "",
                       experts ? fmt::format(" experts {} ep {}", experts, ep) : "");
  }
};

// `meshtrain train` for two steps (under mpirun with `mpi`): the allocator's peak over ranks.
double measured_peak(const Case& c, const std::string& data, const std::filesystem::path& dir,
                     bool mpi) {
  std::string key = c.name() + (mpi ? " mpi" : "");
  for (char& ch : key)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  const auto metrics = (dir / (key + ".jsonl")).string();
  std::string layout = fmt::format("--dp {} --zero {} --batch {} ", c.dp, c.zero, c.batch);
  if (c.tp > 1) layout += fmt::format("--tp {} {}", c.tp, c.sp ? "--sp " : "");
  layout += fmt::format("--recompute {} ", c.recompute);
  if (c.cp > 1) layout += fmt::format("--cp {} --cp-comm {} ", c.cp, c.cp_comm);
  if (c.virtual_stages > 1) layout += fmt::format("--virtual-stages {} ", c.virtual_stages);
  if (c.experts) layout += fmt::format("--moe-experts {} --moe-top-k 2 --ep {} ", c.experts, c.ep);
  if (c.pp > 1)
    layout += fmt::format("--pp {} --microbatches {} --schedule {}", c.pp,
                          c.batch / (c.dp * c.microbatch), c.schedule);
  else
    layout += fmt::format("--microbatch {}", c.microbatch);
  const std::string args = fmt::format(
      "train --model tiny --n-layer {}{} --seq {} {} --steps 2 --data {} --peak-gflops 100 "
      "--metrics {}{}",
      c.n_layer(), c.vocab ? fmt::format(" --vocab {}", c.vocab) : "", c.seq, layout, data, metrics,
      mpi ? " --backend mpi" : "");
  const test::RunResult r = mpi ? test::run_mpirun(c.ranks(), args) : test::run_meshtrain(args);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  double measured = 0;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);)
    measured = std::max(measured, nlohmann::json::parse(line)["peak_bytes"].get<double>());
  return measured;
}

double predicted_peak(const Case& c, const std::string& backend) {
  model::GptConfig g = model::preset("tiny");
  g.n_layer = c.n_layer();
  g.seq_len = c.seq;
  if (c.vocab) g.vocab = c.vocab;
  g.moe.n_experts = c.experts;
  g.moe.top_k = 2;
  Job j;
  j.model = from_gpt(g);
  j.cluster = cluster_preset("dgx-a100");  // memory depends on the backend, not the cluster
  j.cluster.backend = backend;
  j.gpus = c.ranks();
  // Ranks on a CPU (train's device here): its attention kernel follows the sequence length.
  j.cluster.compute_units = 2;
  j.batch = c.batch;
  j.seq = c.seq;
  j.dtype = "f32";
  Layout l;
  l.dp = c.dp;
  l.zero = c.zero;
  l.microbatch = c.microbatch;
  l.pp = c.pp;
  l.tp = c.tp;
  l.sp = c.sp;
  l.schedule = c.schedule;
  l.recompute = parse_recompute(c.recompute);
  l.virtual_stages = c.virtual_stages;
  l.cp = c.cp;
  l.cp_comm = c.cp_comm;
  l.ep = c.ep;
  return memory_per_gpu(j, l).total();
}

void expect_equal_peaks(const Case& c, double predicted, double measured) {
  fmt::print("{}: predicted {:.0f} B, measured {:.0f} B ({:+.2f}%)\n", c.name(), predicted,
             measured, 100 * (predicted / measured - 1));
  EXPECT_NEAR(predicted / measured, 1.0, 0.001) << c.name();
}

TEST(PlanRuntimeMemory, PredictedPeakEqualsTheAllocatorsPeak) {
  const auto dir = test::scratch_dir("plan-mem");
  const std::string data = test::demo_tokens(dir);
  // Pipeline cases: 4 layers over 2 or 4 stages; microbatches in flight from the IR. The
  // last: a GPT-2 vocabulary makes the LM head cost ~33 blocks, so train splits 8 layers
  // 7,1 and stage 0's memory is 7 layers' (the planner must predict that split).
  const Case cases[] = {{1, 0, 8, 8},
                        {2, 0, 8, 4},
                        {2, 1, 8, 4},
                        {2, 2, 8, 4},
                        {2, 3, 8, 4},
                        {4, 1, 8, 2},
                        {4, 3, 8, 1},
                        {1, 0, 8, 2, 2, "1f1b"},
                        {1, 0, 8, 2, 2, "gpipe"},
                        {2, 0, 8, 1, 4, "1f1b"},
                        {1, 0, 8, 8, 1, "1f1b", 2},
                        {1, 0, 8, 8, 1, "1f1b", 2, true},
                        {2, 1, 8, 4, 1, "1f1b", 2, true},
                        {1, 0, 8, 2, 2, "1f1b", 1, false, 8, 50257},
                        {1, 0, 8, 2, 2, "interleaved", 1, false, 0, 0, "none", 2},
                        // 4 microbatches over pp 3: groups of N = 4 > pp (the buffer plan)
                        {1, 0, 8, 2, 3, "interleaved", 1, false, 6, 0, "none", 2},
                        {1, 0, 8, 2, 2, "zb1"},
                        {2, 0, 8, 2, 2, "1f1b", 2},
                        {2, 0, 8, 4, 1, "1f1b", 1, false, 0, 0, "full"},
                        {2, 0, 8, 4, 1, "1f1b", 1, false, 0, 0, "selective"},
                        {1, 0, 8, 2, 2, "1f1b", 1, false, 0, 0, "full"},
                        {2, 2, 8, 4, 1, "1f1b", 2},
                        {2, 3, 8, 4, 1, "1f1b", 2}};
  for (const Case& c : cases)
    expect_equal_peaks(c, predicted_peak(c, "local"), measured_peak(c, data, dir, false));
}

// The blockwise attention kernel (docs/context_parallel.md): from seq 1024 on one rank, and
// on every context-parallel rank with each exchange's workspace; the planner keeps one
// log-sum-exp per row and head, not the T x T probabilities.
TEST(PlanRuntimeMemory, BlockwiseAttentionAndContextParallelPeaks) {
  const auto dir = test::scratch_dir("plan-mem-flash");
  const std::string data = test::demo_tokens(dir);
  Case one{1, 0, 2, 2};
  one.seq = 1024;
  Case selective = one;
  selective.recompute = "selective";
  std::vector<Case> cases = {one, selective};
  for (const char* comm : {"ring", "all-gather", "a2a"}) {
    Case c{1, 0, 8, 4};
    c.cp = 2;
    c.cp_comm = comm;
    cases.push_back(c);
  }
  // (ZeRO 0: with ZeRO-1 and SP the planner counts the SP gradient sync's packed buffer whole,
  // the known +0.07% above, more with the dp x cp shards.)
  Case mixed{2, 0, 8, 2, 1, "1f1b", 2, true};
  mixed.cp = 2;
  cases.push_back(mixed);
  for (const Case& c : cases)
    expect_equal_peaks(c, predicted_peak(c, "local"), measured_peak(c, data, dir, false));
}

// Mixture of experts (docs/moe.md; plan/moe.h our_moe_bytes): 4 GELU experts of d_ff, top 2,
// in both blocks. Every tp rank routes all its tokens and holds the experts whole; with ep
// the expert buffers are sized for the dropless worst case and the dense gradients' packed
// buffer for their sum over ep is communication memory. ZeRO-0 only: with ZeRO the packed
// buffer holds the dense ranges of the rank's shard, which the planner bounds by
// min(dense, shard) (the next test).
TEST(PlanRuntimeMemory, MixtureOfExpertsPeaks) {
  const auto dir = test::scratch_dir("plan-mem-moe");
  const std::string data = test::demo_tokens(dir);
  auto moe = [](Case c, int64_t experts, int ep) {
    c.experts = experts;
    c.ep = ep;
    return c;
  };
  const Case cases[] = {
      moe({1, 0, 8, 8}, 4, 1),                                          // one rank
      moe({2, 0, 8, 4}, 4, 2),                                          // dp 2 = ep 2
      moe({4, 0, 8, 2}, 4, 4),                                          // ep 4
      moe({4, 0, 8, 2}, 4, 2),                                          // dp 4 folding ep 2
      moe({1, 0, 8, 8, 1, "1f1b", 2}, 4, 1),                            // tp 2
      moe({2, 0, 8, 4, 1, "1f1b", 2, true}, 4, 2),                      // ep 2 x tp 2 + sp
      moe({2, 0, 8, 4, 1, "1f1b", 1, false, 0, 0, "full"}, 4, 2),       // full recomputation
      moe({2, 0, 8, 4, 1, "1f1b", 1, false, 0, 0, "selective"}, 4, 2),  // selective
      moe({2, 0, 8, 2, 2, "1f1b"}, 4, 2),                               // ep 2 x pp 2
  };
  for (const Case& c : cases)
    expect_equal_peaks(c, predicted_peak(c, "local"), measured_peak(c, data, dir, false));
}

// ZeRO with ep: the states of every parameter, dense ones included, are sharded over the
// mesh's dp = dp / ep (our runtime; Megatron-Core shards the dense ones over all of dp), and
// the dense gradients' packed buffer is bounded by min(dense, shard): the prediction is at or
// above the peak, by at most that buffer's dense part outside the shard (here < 2%: 171,264
// dense floats against the 103,936 of rank 0's shard, of a 14 MB peak).
TEST(PlanRuntimeMemory, MixtureOfExpertsWithZeroIsBoundedAbove) {
  const auto dir = test::scratch_dir("plan-mem-moe-zero");
  const std::string data = test::demo_tokens(dir);
  for (int zero : {1, 2, 3}) {
    Case c{4, zero, 8, 2};
    c.experts = 4;
    c.ep = 2;
    const double predicted = predicted_peak(c, "local"),
                 measured = measured_peak(c, data, dir, false);
    fmt::print("{}: predicted {:.0f} B, measured {:.0f} B ({:+.2f}%)\n", c.name(), predicted,
               measured, 100 * (predicted / measured - 1));
    EXPECT_GE(predicted, measured) << c.name();
    EXPECT_LT(predicted / measured, 1.02) << c.name();
  }
}

TEST(PlanRuntimeMemory, UnderMpirunThePeakEqualsTheModel) {
  // The mpi backend adds each group's reduce-scatter scratch (comm/mpi.h): DP's, TP's, and
  // the tied embedding's group of the first and last pipeline stage.
  ASSERT_EQ(test::run_command("command -v mpirun").exit_code, 0)
      << "no mpirun: run scripts/setup.sh";
  const auto dir = test::scratch_dir("plan-mem-mpi");
  const std::string data = test::demo_tokens(dir);
  const Case cases[] = {{2, 1, 8, 4}, {1, 0, 8, 2, 2, "1f1b"}, {1, 0, 8, 4, 1, "1f1b", 2, true}};
  for (const Case& c : cases)
    expect_equal_peaks(c, predicted_peak(c, "mpi"), measured_peak(c, data, dir, true));
}

}  // namespace
}  // namespace mt::plan

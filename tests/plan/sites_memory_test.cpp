// The planner's memory model of a DiLoCo run (plan/sites_memory.h) against the runtime's
// accounting allocator: the worst rank's peak that `meshtrain train --sites` measures equals
// the model's to the byte (a site's ranks with ZeRO inside the site, plus the outer state:
// the outer parameters, Nesterov's momentum, the exchange's buffers). And the outer state is
// what the runtime adds: a run with --sites 1 peaks exactly that much above the same run
// without.
#include "plan/sites_memory.h"

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
  int dp, zero, sites;
  const char* optimizer = "nesterov";
  const char* compress = "none";
  int delay = 0;
  int64_t experts = 0;  // MoE: --moe-experts (top 2) in every block
  int ep = 1;

  std::string flags() const {
    std::string f = fmt::format("--dp {} --zero {}", dp, zero);
    if (sites > 0)
      f += fmt::format(" --sites {} --outer-every 2 --outer-optimizer {} --outer-compress {}",
                       sites, optimizer, compress);
    if (delay) f += fmt::format(" --outer-delay {}", delay);
    if (experts) f += fmt::format(" --moe-experts {} --moe-top-k 2 --ep {}", experts, ep);
    return f;
  }
};

// `meshtrain train` for 3 steps (an outer step after step 2): the allocator's peak over ranks.
double measured_peak(const Case& c, const std::string& data, const std::filesystem::path& dir) {
  std::string key = c.flags();
  for (char& ch : key)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  const auto metrics = (dir / (key + ".jsonl")).string();
  const test::RunResult r = test::run_meshtrain(fmt::format(
      "train --model tiny --n-layer 2 --seq 32 --batch 8 --microbatch 2 {} --steps 3 --data {} "
      "--peak-gflops 100 --metrics {}",
      c.flags(), data, metrics));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  double measured = 0;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);)
    measured = std::max(measured, nlohmann::json::parse(line)["peak_bytes"].get<double>());
  return measured;
}

MemoryBytes predicted(const Case& c) {
  model::GptConfig g = model::preset("tiny");
  g.n_layer = 2;
  g.seq_len = 32;
  g.moe.n_experts = c.experts;
  g.moe.top_k = 2;
  Job j;
  j.model = from_gpt(g);
  j.cluster = cluster_preset("dgx-a100");  // memory depends on the backend, not the cluster
  j.cluster.backend = "local";
  j.cluster.compute_units = 2;
  j.gpus = c.dp;
  j.batch = 8;
  j.seq = 32;
  j.dtype = "f32";
  Layout l;
  l.dp = c.dp;
  l.zero = c.zero;
  l.microbatch = 2;
  l.ep = c.ep;
  if (c.sites == 0) return memory_per_gpu(j, l);
  OuterMemory o;
  o.sites = c.sites;
  o.momentum = std::string(c.optimizer) == "nesterov";
  o.compress = c.compress;
  o.delay = c.delay > 0;
  MemoryBytes worst;
  for (const MemoryBytes& m : memory_by_stage_in_sites(j, l, o))
    if (m.total() > worst.total()) worst = m;
  return worst;
}

TEST(SitesMemory, PredictedPeakEqualsTheAllocatorsPeak) {
  const auto dir = test::scratch_dir("sites-mem");
  const std::string data = test::demo_tokens(dir);
  const Case cases[] = {{2, 0, 2},
                        {4, 1, 2, "average"},
                        {4, 3, 2},
                        {4, 2, 2, "nesterov", "bf16"},
                        {2, 0, 2, "nesterov", "int8"},
                        {2, 0, 2, "nesterov", "none", 1},
                        {4, 0, 2, "nesterov", "none", 0, 4, 2}};
  for (const Case& c : cases) {
    const double want = predicted(c).total(), got = measured_peak(c, data, dir);
    fmt::print("{}: predicted {:.0f} B, measured {:.0f} B\n", c.flags(), want, got);
    EXPECT_EQ(want, got) << c.flags();
  }
}

// The outer state is what --sites adds: one site of dp 2 (ZeRO-1, the site the whole dp group,
// each rank's shard half the model) peaks above the same run without --sites by the outer
// parameters and momentum (2 x 4 n) and the f32 exchange buffer (4 n), n = Ψ / 2, exactly.
TEST(SitesMemory, TheOuterStateIsWhatTheRuntimeAdds) {
  const auto dir = test::scratch_dir("sites-mem-add");
  const std::string data = test::demo_tokens(dir);
  const Case without{2, 1, 0}, with{2, 1, 1};
  const double added = measured_peak(with, data, dir) - measured_peak(without, data, dir);
  OuterMemory o;
  o.sites = 1;
  const double psi = predicted(without).parameters / 4;  // ZeRO-1: every value on every rank
  EXPECT_EQ(added, outer_state_bytes(psi / 2, o).total());
  EXPECT_EQ(added, 3 * 4 * psi / 2);
}

// train's up-front memory check (cli/memory_check.h) counts the outer state: 2 sites of one
// rank each on a host (MESHTRAIN_HOST_MEMORY) of exactly the 2 ranks' modelled peak run; one
// byte less is refused before anything is allocated. Without the outer state counted the
// check would have asked for 12 n bytes per rank less and let the smaller host through.
TEST(SitesMemory, TrainsMemoryCheckCountsTheOuterState) {
  const auto dir = test::scratch_dir("sites-mem-check");
  const std::string data = test::demo_tokens(dir);
  const Case c{2, 0, 2};
  const double need = 2 * predicted(c).total();
  const std::string run = fmt::format(
      "{} train --model tiny --n-layer 2 --seq 32 --batch 8 --microbatch 2 {} --steps 2 "
      "--threads 1 --peak-gflops 100 --data {}",
      MT_BINARY, c.flags(), data);
  const test::RunResult refused =
      test::run_command(fmt::format("MESHTRAIN_HOST_MEMORY={:.0f} {}", need - 1, run));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("this run needs"), std::string::npos) << refused.output;
  EXPECT_EQ(refused.output.find("meshtrain: model"), std::string::npos) << refused.output;
  const test::RunResult ok =
      test::run_command(fmt::format("MESHTRAIN_HOST_MEMORY={:.0f} {}", need, run));
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
}

}  // namespace
}  // namespace mt::plan

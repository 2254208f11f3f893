// The CLI: `meshtrain schedule` prints a verified grid; `meshtrain train --pp` runs each
// schedule, writes a trace with one row per rank, runs under mpirun, and refuses a layout
// that cannot run before any work.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "pipeline_test_util.h"

namespace mt::test {
namespace {

std::string small_run() {
  return "train --model tiny --n-layer 4 --seq 32 --batch 8 --steps 3 --threads 1 "
         "--peak-gflops 100 --data " +
         pp_demo_data();
}

TEST(PipelineCli, SchedulePrintsAVerifiedGrid) {
  const RunResult r = run_meshtrain("schedule --pp 4 --microbatches 8 --schedule 1f1b --timeline");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("verified"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("bubble fraction 0.2727"), std::string::npos) << r.output;  // 3/11
  const RunResult zb = run_meshtrain("schedule --pp 4 --microbatches 8 --schedule zb1");
  EXPECT_NE(zb.output.find("bubble fraction 0.1111"), std::string::npos) << zb.output;  // 3/27
  // Megatron-LM's batched exchanges, replayed as NCCL runs them: the interleaved bubble
  // (p − 1)/(v·m + p − 1) = 3/19 with free transfers.
  const RunResult nccl = run_meshtrain(
      "schedule --pp 4 --microbatches 8 --schedule interleaved --virtual-stages 2 --batched");
  EXPECT_EQ(nccl.exit_code, 0) << nccl.output;
  EXPECT_NE(nccl.output.find("also with blocking exchanges"), std::string::npos) << nccl.output;
  EXPECT_NE(nccl.output.find("bubble fraction 0.1579"), std::string::npos) << nccl.output;
}

TEST(PipelineCli, TrainWritesATraceWithOneRowPerRank) {
  const std::string trace = (scratch_dir("pp") / "trace.json").string();
  const RunResult r = run_meshtrain(
      small_run() + " --pp 2 --dp 2 --microbatches 4 --schedule zb1 --trace " + trace);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("pp 2 (zb1 schedule"), std::string::npos) << r.output;
  std::ifstream f(trace);
  const nlohmann::json j = nlohmann::json::parse(f);
  std::set<int> rows;
  std::set<std::string> cats;
  for (const auto& e : j.at("traceEvents"))
    if (e.at("ph") == "X") {
      rows.insert(e.at("tid").get<int>());
      cats.insert(e.at("cat").get<std::string>());
    }
  EXPECT_EQ(rows, (std::set<int>{0, 1, 2, 3}));
  for (const char* c : {"forward", "backward", "weight", "send", "idle"})
    EXPECT_TRUE(cats.count(c)) << c;
  // Megatron-LM's batched exchanges on request (by default only with --backend nccl).
  const RunResult b = run_meshtrain(small_run() +
                                    " --pp 2 --microbatches 4 --schedule interleaved "
                                    "--virtual-stages 2 --pp-exchanges batched");
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("batched exchanges"), std::string::npos) << b.output;
  EXPECT_EQ(r.output.find("batched exchanges"), std::string::npos) << r.output;
}

TEST(PipelineCli, RefusesWhatCannotRun) {
  struct Case {
    std::string flags, message;
  };
  for (const Case& c : std::vector<Case>{
           {"--pp 4 --microbatches 2", "--microbatches 2 is fewer than --pp 4"},
           {"--pp 3 --microbatches 4 --schedule interleaved --virtual-stages 2 "
            "--pp-layers 0,1,1,1,1,0 --pp-exchanges batched",
            "need --microbatches divisible by --pp: 4 is not a multiple of 3 (use 3 or 6; the "
            "per-action lowering takes any count)"},
           {"--pp 2 --pp-layers 1,2", "covers 3 layers but the model has n_layer 4"},
           {"--pp 2 --schedule 2f2b", "unknown --schedule '2f2b'"},
           {"--pp 2 --pp-exchanges grouped", "--pp-exchanges 'grouped' is not a grouping"},
           {"--pp 2 --microbatches 3",
            "--microbatches 3 does not divide the 8 sequences per dp replica"},
           {"--pp 3", "--pp 3 (the default --microbatches) does not divide the 8"},
           {"--pp 4 --microbatches 4 --schedule interleaved --virtual-stages 2",
            "--pp 4 x --virtual-stages 2 = 8 pipeline chunks but the model has 4 layers"},
           {"--pp 2 --microbatch 3", "--microbatch 3 does not divide --batch 8"},
           {"--pp 2 --microbatch 2", "--microbatch 2 disagrees with --batch 8"},
           {"--pp 2 --microbatches 4 --microbatch 4",
            "--microbatch 4 and --microbatches 4 disagree"},
           {"--virtual-stages 2", "--virtual-stages 2 needs a pipeline"},
           {"--trace t.json", "--trace t.json writes the pipeline's timeline and needs --pp 2"},
       }) {
    const RunResult r = run_meshtrain(small_run() + " " + c.flags);
    EXPECT_EQ(r.exit_code, 2) << c.flags << "\n" << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.flags << "\n" << r.output;
    EXPECT_EQ(r.output.find("step "), std::string::npos) << "refused before any work";
  }
}

TEST(PipelineCli, UnderMpirun) {
  ASSERT_EQ(run_command("command -v mpirun").exit_code, 0) << "no mpirun: run scripts/setup.sh";
  const RunResult mpi = run_mpirun(4, small_run() + " --pp 2 --dp 2 --microbatches 4");
  ASSERT_EQ(mpi.exit_code, 0) << mpi.output;
  const RunResult local = run_meshtrain(small_run() + " --pp 2 --dp 2 --microbatches 4");
  ASSERT_EQ(local.exit_code, 0) << local.output;
  // Same layout, same numbers: the step-3 loss printed by both.
  auto loss3 = [](const std::string& out) {
    const size_t at = out.find("step     3/3 | loss ");
    return at == std::string::npos ? std::string("?") : out.substr(at + 20, 6);
  };
  EXPECT_EQ(loss3(mpi.output), loss3(local.output)) << mpi.output << local.output;
}

}  // namespace
}  // namespace mt::test

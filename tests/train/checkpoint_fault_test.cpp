// Checkpoints under faults (docs/checkpoints.md): the job SIGKILLed in the middle of a save
// keeps the previous checkpoint; SIGKILLed mid-run, the same command line with --resume auto
// finishes with the uninterrupted run's final loss; --max-restarts recovers in-process;
// under mpirun, one rank SIGKILLed ends the job promptly and scripts/supervise-mpirun.sh
// restarts it. Faults are injected with MESHTRAIN_FAULT (train/checkpoint.h maybe_fault):
// the process sends itself SIGKILL at a chosen point, which nothing can catch.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "train/checkpoint.h"

namespace mt::test {
namespace {

namespace fs = std::filesystem;
namespace ckpt = train::ckpt;

const fs::path& dir() {
  static const fs::path d = scratch_dir("ckpt-fault");
  return d;
}

const std::string& data() {
  static const std::string p = demo_tokens(dir());
  return p;
}

// 8 steps of a 2-layer tiny model on 2 dp ranks (ZeRO-1), a checkpoint every 2 steps.
std::string flags(const fs::path& ckpt_dir, const fs::path& metrics) {
  return "train --model tiny --n-layer 2 --data " + data() +
         " --steps 8 --batch 8 --threads 1 --peak-gflops 100 --dp 2 --zero 1 --checkpoint-dir " +
         ckpt_dir.string() + " --checkpoint-every 2 --metrics " + metrics.string();
}

// The "loss" of the last line of a metrics file, as written (exact text).
std::string final_loss(const fs::path& metrics) {
  std::ifstream in(metrics);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  if (last.empty()) return "";
  return nlohmann::json::parse(last).at("loss").dump();
}

const std::string& uninterrupted_loss() {
  static const std::string loss = [] {
    const fs::path c = dir() / "clean", m = dir() / "clean.jsonl";
    const RunResult r = run_meshtrain(flags(c, m) + " --backend local");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(final_loss(m), "") << r.output;
    return final_loss(m);
  }();
  return loss;
}

std::string latest(const fs::path& c) {
  std::ifstream in(c / "latest");
  std::string s;
  std::getline(in, s);
  return s;
}

class KilledWhileSaving : public ::testing::TestWithParam<std::string> {};

TEST_P(KilledWhileSaving, ThePreviousCheckpointStaysAndTheRestartFinishes) {
  const std::string point = GetParam();
  const fs::path c = dir() / ("save_" + point), m = dir() / ("save_" + point + ".jsonl");
  fs::remove_all(c);
  // Rank 1 dies after writing its shard; rank 0 after the index, or after the rename.
  const int rank = point == "save-shards" ? 1 : 0;
  const RunResult killed =
      run_command("MESHTRAIN_FAULT=kill@" + point + ":4:" + std::to_string(rank) + " " + MT_BINARY +
                  " " + flags(c, m) + " --backend local");
  ASSERT_EQ(killed.exit_code, 128 + 9) << killed.output;  // SIGKILL
  const std::vector<std::string> left = ckpt::list_checkpoints(c.string());
  ASSERT_FALSE(left.empty());
  // Until the rename, step 4 is only a temporary directory; after it, step 4 is complete
  // and `latest` (moved last) still names step 2.
  const bool renamed = point == "save-renamed";
  EXPECT_EQ(left.front(), (c / (renamed ? "step-00000004" : "step-00000002")).string());
  EXPECT_EQ(fs::exists(c / "step-00000004.tmp"), !renamed);
  EXPECT_EQ(latest(c), "step-00000002");
  for (const std::string& k : left) EXPECT_TRUE(ckpt::verify(ckpt::read_index(k)).empty()) << k;

  const RunResult again = run_meshtrain(flags(c, m) + " --backend local --resume auto");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find(renamed ? "step-00000004 (step 4" : "step-00000002 (step 2"),
            std::string::npos)
      << again.output;
  EXPECT_EQ(final_loss(m), uninterrupted_loss());
  EXPECT_EQ(latest(c), "step-00000008");
  EXPECT_FALSE(fs::exists(c / "step-00000004.tmp"));
}

INSTANTIATE_TEST_SUITE_P(Points, KilledWhileSaving,
                         ::testing::Values("save-shards", "save-index", "save-renamed"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// SIGKILL in the middle of the run (after step 5, the newest checkpoint step 4): the same
// command line with --resume auto finishes with the uninterrupted run's loss, bitwise.
TEST(CheckpointFault, KilledMidRunResumesToTheSameFinalLoss) {
  const fs::path c = dir() / "midrun", m = dir() / "midrun.jsonl";
  fs::remove_all(c);
  const std::string cmd = flags(c, m) + " --backend local --resume auto";
  const RunResult killed =
      run_command(std::string("MESHTRAIN_FAULT=kill@step:5:0 ") + MT_BINARY + " " + cmd);
  ASSERT_EQ(killed.exit_code, 128 + 9) << killed.output;
  EXPECT_NE(killed.output.find("no checkpoint in"), std::string::npos) << killed.output;
  const RunResult again = run_meshtrain(cmd);
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("step-00000004 (step 4"), std::string::npos) << again.output;
  EXPECT_EQ(final_loss(m), uninterrupted_loss());
}

// --max-restarts: one rank fails at step 5 (once); the job fails promptly, restarts from
// step 4 in the same process and finishes with the uninterrupted run's loss.
TEST(CheckpointFault, MaxRestartsRecoversInProcess) {
  const fs::path c = dir() / "restarts", m = dir() / "restarts.jsonl";
  fs::remove_all(c);
  const std::string once = (dir() / "restarts.once").string();
  fs::remove(once);
  const RunResult r = run_command("MESHTRAIN_FAULT=throw@step:5:1:" + once + " " + MT_BINARY + " " +
                                  flags(c, m) + " --backend local --resume auto --max-restarts 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("injected fault"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("restarting from the newest checkpoint"), std::string::npos) << r.output;
  EXPECT_EQ(final_loss(m), uninterrupted_loss());
}

// Under mpirun: rank 1 is SIGKILLed at step 5 (once); mpirun ends the job with a non-zero
// exit, the supervisor runs the same command again, which resumes from step 4.
TEST(CheckpointFault, MpirunRankKilledSupervisorRestarts) {
  ASSERT_EQ(run_command("command -v mpirun").exit_code, 0) << "no mpirun: run scripts/setup.sh";
  const fs::path c = dir() / "mpirun", m = dir() / "mpirun.jsonl";
  fs::remove_all(c);
  const std::string once = (dir() / "mpirun.once").string();
  fs::remove(once);
  const std::string env =
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
      "OMPI_MCA_rmaps_base_oversubscribe=1 MESHTRAIN_FAULT=kill@step:5:1:" +
      once + " ";
  const RunResult r = run_command(env + MT_SOURCE_DIR + "/scripts/supervise-mpirun.sh 2 " +
                                  "mpirun -np 2 --oversubscribe -x MESHTRAIN_FAULT " + MT_BINARY +
                                  " " + flags(c, m) + " --comm-timeout 30 --resume auto");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("mpi backend"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("SIGKILL at step of step 5"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("restart 1 of 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step-00000004 (step 4"), std::string::npos) << r.output;
  // Prompt: the killed job ended well before the 30 s watchdog timeout.
  const size_t at = r.output.find("the job exited with");
  ASSERT_NE(at, std::string::npos) << r.output;
  const std::string tail = r.output.substr(at);
  const int secs = std::stoi(tail.substr(tail.find("after ") + 6));
  EXPECT_LT(secs, 30) << tail;
  // Under mpirun the ranks reduce in the same order as the local backend's threads.
  EXPECT_EQ(final_loss(m), uninterrupted_loss());
}

// The CLI round trip: inspect, export from a checkpoint of another layout (the same weights
// as train --export), reshard offline, and a damaged shard named by inspect.
TEST(CheckpointCli, InspectExportReshard) {
  const fs::path c = dir() / "cli", m = dir() / "cli.jsonl";
  fs::remove_all(c);
  const std::string exported = (dir() / "cli_train.safetensors").string();
  const RunResult t =
      run_meshtrain(flags(c, m) + " --backend local --tp 2 --sp --export " + exported);
  ASSERT_EQ(t.exit_code, 0) << t.output;
  const RunResult ins = run_meshtrain("inspect " + c.string());
  ASSERT_EQ(ins.exit_code, 0) << ins.output;
  EXPECT_NE(ins.output.find("step 8"), std::string::npos) << ins.output;
  EXPECT_NE(ins.output.find("layout dp 2 tp 2 pp 1 zero 1"), std::string::npos) << ins.output;
  EXPECT_NE(ins.output.find("checksums OK"), std::string::npos) << ins.output;
  const std::string from_ckpt = (dir() / "cli_ckpt.safetensors").string();
  const RunResult ex = run_meshtrain("export " + c.string() + " --out " + from_ckpt);
  ASSERT_EQ(ex.exit_code, 0) << ex.output;
  EXPECT_EQ(run_command("cmp " + exported + " " + from_ckpt).exit_code, 0);
  const fs::path re = dir() / "cli_re";
  fs::remove_all(re);
  const RunResult rs =
      run_meshtrain("reshard " + c.string() + " --out " + re.string() + " --pp 2 --dp 2 --zero 3");
  ASSERT_EQ(rs.exit_code, 0) << rs.output;
  const std::string from_re = (dir() / "cli_re.safetensors").string();
  ASSERT_EQ(run_meshtrain("export " + re.string() + " --out " + from_re).exit_code, 0);
  EXPECT_EQ(run_command("cmp " + exported + " " + from_re).exit_code, 0);
  // A damaged shard: inspect names it, exit code 2.
  const fs::path shard = re / "step-00000008" / "rank-00002.safetensors";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(shard)) - 7);
    f.put('\x7f');
  }
  const RunResult bad = run_meshtrain("inspect " + re.string());
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("DAMAGED '" + shard.string() + "'"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace mt::test

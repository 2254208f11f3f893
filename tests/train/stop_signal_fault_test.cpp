// A clean stop on a signal (train/stop_signals.h, docs/checkpoints.md "Stopping a run"):
// SIGTERM, SIGINT or SIGUSR1 mid-run finishes the step, saves a checkpoint at that step,
// flushes the metrics and exits 3 with one line; the same command with --resume auto ends
// with the uninterrupted run's loss, bitwise. Under mpirun every rank stops at the same step
// even when only one got the signal; a second signal ends the process at once; the
// supervisor stops (and forwards) instead of restarting.
#include <fmt/format.h>
#include <gtest/gtest.h>

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
  static const fs::path d = scratch_dir("stop-signal");
  return d;
}

const std::string& data() {
  static const std::string p = demo_tokens(dir());
  return p;
}

// 8 steps of a 2-layer tiny model on 2 dp ranks (ZeRO-1), a checkpoint every 4 steps.
std::string flags(const fs::path& ckpt_dir, const fs::path& metrics, int steps = 8) {
  return "train --model tiny --n-layer 2 --data " + data() + " --steps " + std::to_string(steps) +
         " --batch 8 --threads 1 --peak-gflops 100 --dp 2 --zero 1 --checkpoint-dir " +
         ckpt_dir.string() + " --checkpoint-every 4 --metrics " + metrics.string();
}

std::vector<nlohmann::json> rows(const fs::path& metrics) {
  std::vector<nlohmann::json> out;
  std::ifstream in(metrics);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

// The "loss" of the last metrics row, as written (exact text).
std::string final_loss(const fs::path& metrics) {
  const std::vector<nlohmann::json> r = rows(metrics);
  return r.empty() ? "" : r.back().at("loss").dump();
}

const std::string& uninterrupted_loss() {
  static const std::string loss = [] {
    const fs::path c = dir() / "clean", m = dir() / "clean.jsonl";
    const RunResult r = run_meshtrain(flags(c, m) + " --backend local");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return final_loss(m);
  }();
  return loss;
}

// The signal reaches the process after step 3 (MESHTRAIN_FAULT sends it to the process
// itself, so the step is known): step 4 finishes, is saved (not a --checkpoint-every step),
// and the run exits 3. The same command with --resume auto finishes bitwise like the run
// that was never stopped.
class StopsCleanly : public ::testing::TestWithParam<std::string> {};

TEST_P(StopsCleanly, CheckpointAtTheStepAndResumeIsBitwise) {
  const std::string sig = GetParam();
  const fs::path c = dir() / ("local_" + sig), m = dir() / ("local_" + sig + ".jsonl");
  fs::remove_all(c);
  const std::string cmd = flags(c, m) + " --backend local --resume auto";
  const RunResult r =
      run_command("MESHTRAIN_FAULT=" + sig + "@step:3:0 " + std::string(MT_BINARY) + " " + cmd);
  ASSERT_EQ(r.exit_code, 3) << r.output;
  const std::string name = sig == "term" ? "SIGTERM" : sig == "int" ? "SIGINT" : "SIGUSR1";
  EXPECT_NE(r.output.find("meshtrain: " + name + ": finishing the current step"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("stopped by " + name + " after step 4 of 8: checkpoint " + c.string() +
                          "/step-00000004 saved"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("error:"), std::string::npos) << r.output;
  EXPECT_EQ(ckpt::list_checkpoints(c.string()).front(), (c / "step-00000004").string());
  ASSERT_EQ(rows(m).size(), 4u);
  EXPECT_EQ(rows(m).back().at("step"), 4);

  const RunResult again = run_meshtrain(cmd);
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("step-00000004 (step 4"), std::string::npos) << again.output;
  EXPECT_EQ(rows(m).size(), 8u);
  EXPECT_EQ(final_loss(m), uninterrupted_loss());
}

INSTANTIATE_TEST_SUITE_P(Signals, StopsCleanly, ::testing::Values("term", "int", "usr1"));

// Without --checkpoint-dir the stop still finishes the step and says that nothing was saved.
TEST(StopSignal, WithoutCheckpointDirSaysNothingSaved) {
  const fs::path m = dir() / "nodir.jsonl";
  const std::string cmd = "train --model tiny --n-layer 2 --data " + data() +
                          " --steps 8 --batch 8 --threads 1 --peak-gflops 100 --metrics " +
                          m.string();
  const RunResult r =
      run_command("MESHTRAIN_FAULT=term@step:2:0 " + std::string(MT_BINARY) + " " + cmd);
  ASSERT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("stopped by SIGTERM after step 3 of 8: nothing saved"), std::string::npos)
      << r.output;
  EXPECT_EQ(rows(m).size(), 3u);
}

// Under mpirun only rank 1's process gets SIGTERM: the flag travels in the step's
// all-reduce, so both processes stop after step 4, one checkpoint of step 4, exit 3; the
// resume ends bitwise like the uninterrupted run.
TEST(StopSignal, MpirunEveryRankStopsAtTheSameStep) {
  ASSERT_EQ(run_command("command -v mpirun").exit_code, 0) << "no mpirun: run scripts/setup.sh";
  const fs::path c = dir() / "mpirun", m = dir() / "mpirun.jsonl";
  fs::remove_all(c);
  const std::string cmd = flags(c, m) + " --comm-timeout 60 --resume auto";
  const RunResult r =
      run_command(mpirun(2) + "-x MESHTRAIN_FAULT=term@step:3:1 " + MT_BINARY + " " + cmd);
  ASSERT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("mpi backend"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("stopped by a signal after step 4 of 8: checkpoint"), std::string::npos)
      << r.output;
  EXPECT_EQ(ckpt::list_checkpoints(c.string()).front(), (c / "step-00000004").string());
  EXPECT_TRUE(ckpt::verify(ckpt::read_index((c / "step-00000004").string())).empty());
  const RunResult again = run_mpirun(2, cmd);
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(final_loss(m), uninterrupted_loss());
}

// A real signal from outside, twice: the second ends the process at once (status 128 +
// SIGTERM), without waiting for the step. A long run (it never reaches its end here). The
// second signal must arrive while the step the first one let finish is still running: batch
// 128 makes a step about 0.5 s on a quiet 2-core host, ten times the watcher's 0.05 s poll
// (at batch 16, 77 ms, a clean-clone CI run once saw the step end first).
TEST(StopSignal, SecondSignalStopsAtOnce) {
  const fs::path m = dir() / "twice.jsonl", log = dir() / "twice.log";
  fs::remove(m);
  fs::remove(log);
  const std::string cmd = std::string(MT_BINARY) + " train --model tiny --data " + data() +
                          " --steps 100000 --batch 128 --threads 1 --peak-gflops 100 --metrics " +
                          m.string() + " > " + log.string() + " 2>&1";
  // Waits (up to 120 s each) for the first metrics row, sends SIGTERM, waits for the run to
  // say it got it (two signals sent at once would be one: a pending signal is a bit), then
  // sends the second.
  const RunResult r = run_command(
      "(" + cmd + " & pid=$!; for i in $(seq 2400); do [ -s " + m.string() +
      " ] && break; sleep 0.05; done; kill -TERM $pid; for i in $(seq 2400); do grep -q "
      "'finishing the current step' " +
      log.string() +
      " && break; sleep 0.05; done; kill -TERM $pid; wait $pid; echo \"exit=$?\"; cat " +
      log.string() + ")");
  EXPECT_NE(r.output.find("exit=143"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("a second signal: stopping at once"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("stopped by SIGTERM"), std::string::npos) << r.output;
}

// scripts/supervise-mpirun.sh: SIGINT to the supervisor (Ctrl-C) is forwarded to the job
// (to mpirun as SIGUSR1, which Open MPI passes on to every rank), the job stops cleanly with
// a checkpoint, and the supervisor exits with the job's 3 instead of restarting it.
TEST(StopSignal, SupervisorForwardsAndDoesNotRestart) {
  ASSERT_EQ(run_command("command -v mpirun").exit_code, 0) << "no mpirun: run scripts/setup.sh";
  const fs::path c = dir() / "supervised", m = dir() / "supervised.jsonl";
  fs::remove_all(c);
  fs::remove(m);
  const std::string cmd =
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
      "OMPI_MCA_rmaps_base_oversubscribe=1 " +
      std::string(MT_SOURCE_DIR) + "/scripts/supervise-mpirun.sh 3 mpirun -np 2 --oversubscribe " +
      MT_BINARY + " " + flags(c, m, 100000) + " --comm-timeout 60 --resume auto";
  // set -m: the supervisor started with & keeps SIGINT (as from a terminal's Ctrl-C), in a
  // process group of its own. Waits for the first metrics row (up to 120 s), sends SIGINT,
  // then waits for the supervisor (up to 120 s; still there: it failed to stop, and its
  // process group gets SIGTERM, on which mpirun ends its ranks, so that the test ends).
  const RunResult r = run_command(
      "bash -c 'set -m; " + cmd + " & pid=$!; for i in $(seq 2400); do [ -s " + m.string() +
      " ] && break; sleep 0.05; done; kill -INT $pid; for i in $(seq 1200); do kill -0 $pid "
      "2>/dev/null || break; sleep 0.1; done; if kill -0 $pid 2>/dev/null; then echo \"still "
      "running\"; kill -TERM -- -$pid; fi; wait $pid; echo \"exit=$?\"'");
  EXPECT_NE(r.output.find("exit=3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("supervise-mpirun: SIGINT: stopping the job"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("restart 1 of"), std::string::npos) << r.output;
  const std::vector<std::string> saved = ckpt::list_checkpoints(c.string());
  ASSERT_FALSE(saved.empty()) << r.output;
  // The checkpoint is of the last step trained (the last metrics row).
  const std::vector<nlohmann::json> rs = rows(m);
  ASSERT_FALSE(rs.empty());
  EXPECT_EQ(saved.front(),
            (c / fmt::format("step-{:08}", rs.back().at("step").get<int64_t>())).string());
}

}  // namespace
}  // namespace mt::test

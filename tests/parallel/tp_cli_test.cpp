// The CLI: `meshtrain train --tp T [--sp]` runs (alone and with --dp), and a layout that
// cannot run is refused before any work with a message naming the valid values.
#include <gtest/gtest.h>

#include "tp_test_util.h"
#include "train/safetensors.h"

namespace mt::test {
namespace {

std::string small_run() {
  return "train --model tiny --n-layer 2 --seq 32 --batch 8 --steps 3 --threads 1 "
         "--peak-gflops 100 --data " +
         dp_demo_data();
}

TEST(TpCli, TensorAndSequenceParallelRuns) {
  const RunResult r = run_meshtrain(small_run() + " --tp 2 --sp");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tp 2 with sequence parallelism"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step     3/3"), std::string::npos) << r.output;
}

TEST(TpCli, CombinedWithDataParallelRuns) {
  const RunResult r = run_meshtrain(small_run() + " --dp 2 --tp 2 --zero 1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("dp 2 (ZeRO-1, local backend), tp 2"), std::string::npos) << r.output;
}

TEST(TpCli, TpThatDoesNotDivideTheHeadsIsRefused) {
  const RunResult r = run_meshtrain(small_run() + " --tp 3");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--tp 3 does not divide n_head=4"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("choose --tp among 1, 2, 4"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("step"), std::string::npos) << "refused before any work";
}

TEST(TpCli, SequenceNotDivisibleWithSpIsRefused) {
  std::string cmd = small_run();
  cmd.replace(cmd.find("--seq 32"), 8, "--seq 30");
  const RunResult r = run_meshtrain(cmd + " --tp 4 --sp");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--seq 30 is not divisible by --tp 4"), std::string::npos) << r.output;
}

TEST(TpCli, SpWithoutTpIsRefused) {
  const RunResult r = run_meshtrain(small_run() + " --sp");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--sp needs tensor parallelism"), std::string::npos) << r.output;
}

// --export gathers the shards: the file of a tp 2 --sp run holds the same tensors as the
// single rank's, equal within the equivalence tolerance (tp_equiv_test.cpp).
// tp 3 on 12 heads pads the vocabulary to 384 rows (lcm(128, 3)): the file still holds
// the 256 real rows only.
class TpExport : public ::testing::TestWithParam<std::string> {};

TEST_P(TpExport, GathersTheShards) {
  std::string base = small_run();
  if (GetParam() == "--tp 3") {
    base.replace(base.find("--seq 32"), 8, "--seq 24");
    base += " --n-head 12 --d-model 96 --d-ff 384";
  }
  const auto dir = scratch_dir("tp-export");
  const std::string one = (dir / "one.safetensors").string();
  const std::string two = (dir / "two.safetensors").string();
  ASSERT_EQ(run_meshtrain(base + " --export " + one).exit_code, 0);
  const RunResult r = run_meshtrain(base + " " + GetParam() + " --export " + two);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const train::SafetensorsFile a = train::read_safetensors(one);
  const train::SafetensorsFile b = train::read_safetensors(two);
  ASSERT_EQ(a.arrays.size(), b.arrays.size());
  for (const auto& [name, arr] : a.arrays) {
    ASSERT_TRUE(b.arrays.count(name)) << name;
    const auto& other = b.arrays.at(name);
    ASSERT_EQ(arr.shape, other.shape) << name;
    EXPECT_LT(max_abs_diff(arr.data, other.data), 5e-5) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, TpExport, ::testing::Values("--tp 2 --sp", "--tp 3"),
                         [](const auto& info) {
                           return info.param == "--tp 3" ? std::string("tp3")
                                                         : std::string("tp2_sp");
                         });

// Under mpirun (one process per rank, the mpi backend): dp 2 x tp 2 with --sp prints the
// same losses as the local backend (both reduce in rank order).
TEST(TpCli, UnderMpirunMatchesTheLocalBackend) {
  ASSERT_EQ(run_command("command -v mpirun").exit_code, 0) << "no mpirun: run scripts/setup.sh";
  const std::string flags = small_run() + " --dp 2 --tp 2 --sp --zero 1";
  const RunResult mpi = run_mpirun(4, flags);
  ASSERT_EQ(mpi.exit_code, 0) << mpi.output;
  EXPECT_NE(mpi.output.find("mpi backend"), std::string::npos) << mpi.output;
  const RunResult local = run_meshtrain(flags + " --backend local");
  ASSERT_EQ(local.exit_code, 0) << local.output;
  auto loss_of = [](const std::string& out) {
    const size_t at = out.find("step     3/3 | loss ");
    return at == std::string::npos ? std::string() : out.substr(at, 27);
  };
  EXPECT_FALSE(loss_of(local.output).empty()) << local.output;
  EXPECT_EQ(loss_of(mpi.output), loss_of(local.output));
  // dp x tp must equal the number of processes.
  const RunResult bad = run_mpirun(2, flags);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("mpirun started 2 processes but --pp 1 x --dp 2 x --tp 2 is 4"),
            std::string::npos)
      << bad.output;
}

}  // namespace
}  // namespace mt::test

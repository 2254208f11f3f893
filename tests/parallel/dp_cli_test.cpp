// The CLI: `meshtrain train --dp N --zero S` runs (local backend, and under mpirun when it
// is installed), and a batch that does not divide over the ranks is refused before any work.
#include <gtest/gtest.h>

#include "dp_test_util.h"

namespace mt::test {
namespace {

std::string small_run() {
  return "train --model tiny --n-layer 2 --seq 32 --batch 8 --steps 3 --threads 1 "
         "--peak-gflops 100 --data " +
         dp_demo_data();
}

TEST(DpCli, DataParallelZero1Runs) {
  const RunResult r = run_meshtrain(small_run() + " --dp 2 --zero 1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("dp 2 (ZeRO-1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step     3/3"), std::string::npos) << r.output;
}

TEST(DpCli, BatchNotDivisibleByDpIsRefused) {
  const RunResult r = run_meshtrain(small_run() + " --dp 3");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--batch 8 is not divisible by --dp 3"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("step"), std::string::npos) << "refused before any work";
}

TEST(DpCli, BadStageIsRefused) {
  const RunResult r = run_meshtrain(small_run() + " --dp 2 --zero 4");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--zero 4 must be 0, 1, 2 or 3"), std::string::npos) << r.output;
}

TEST(DpCli, UnderMpirunZero3Runs) {
  ASSERT_EQ(run_command("command -v mpirun").exit_code, 0) << "no mpirun: run scripts/setup.sh";
  const RunResult r = run_mpirun(2, small_run() + " --dp 2 --zero 3");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("mpi backend"), std::string::npos) << r.output;
  const RunResult bad = run_mpirun(2, small_run() + " --dp 4");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("mpirun started 2 processes but --pp 1 x --dp 4 x --tp 1 is 4"),
            std::string::npos)
      << bad.output;
}

}  // namespace
}  // namespace mt::test

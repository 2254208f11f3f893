// Faults under mpirun: each faulty job runs as `mpirun -np 4 --oversubscribe <this binary>`
// with MT_COMM_FAULT set, and must end non-zero, promptly, with the diagnosis.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <thread>

#include "comm/launch.h"
#include "comm_subprocess.h"
#include "core/error.h"

namespace mt::comm {
namespace {

constexpr double kTimeoutS = 2;
// How long a faulty job may take to end, start to finish: the defects these tests guard
// are a job that hangs (a killed rank's peers, a mismatched collective: forever) or one that
// waits for the sleeping rank (60 s, MpiChild "skip") instead of the watchdog ending it.
// 40 s is below both and far above the healthy end under load: mpirun's start, the 2 s
// timeout, the 2 s wait for the ranks' answers and the teardown took up to 13.9 s in a
// clean-clone CI run on 2 cores with five tests at once (2026-11-28), 6-8 s alone.
constexpr double kEndsWithinS = 40;

TEST(MpiChild, Run) {
  const char* env = std::getenv("MT_COMM_FAULT");
  if (!env) return;  // the child process's entry point; CTest does not list it
  std::string fault = env;
  LaunchOptions o;
  o.backend = BackendKind::kMpi;
  o.world_size = 0;
  o.timeout_s = kTimeoutS;
  o.check_headers = fault == "different";  // "different-nocheck": the watchdog's case
  launch(o, [&](Group& world) {
    std::vector<float> x(1000, 1.0f), y(4000);
    world.all_reduce(Buf(x.data(), 1000));  // #1
    if (fault == "kill") {
      if (world.rank() == 2) std::raise(SIGKILL);
      world.all_reduce(Buf(x.data(), 1000));
    } else if (fault == "skip") {
      if (world.rank() == 2)
        std::this_thread::sleep_for(std::chrono::seconds(60));
      else
        world.all_reduce(Buf(x.data(), 1000));  // #2
    } else if (fault == "different" || fault == "different-nocheck") {
      if (world.rank() == 3)
        world.all_gather(Buf(x.data(), 1000), Buf(y.data(), 4000));
      else
        world.all_reduce(Buf(x.data(), 1000));
    }
  });
  std::_Exit(0);
}

testing::ChildResult run_fault(const std::string& fault) {
  return testing::run_child(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 MT_COMM_FAULT=" + fault +
      " mpirun -np 4 --oversubscribe " + testing::self_exe() + " --gtest_filter=MpiChild.Run");
}

void expect_has(const std::string& out, const std::string& what) {
  EXPECT_NE(out.find(what), std::string::npos) << "missing: " << what << "\n--- output:\n" << out;
}

TEST(MpiFault, AKilledRankEndsTheJobNonZero) {
  auto r = run_fault("kill");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(r.time_s, kEndsWithinS);  // mpirun notices the death; the watchdog backs it up
}

TEST(MpiFault, WatchdogEndsEveryProcessWithTheDiagnosis) {
  auto r = run_fault("skip");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(r.time_s, kEndsWithinS);
  expect_has(r.output, "comm watchdog: all_reduce #2 on world");
  expect_has(r.output, "not arrived: ranks [2]");
  expect_has(r.output, "rank 2 has no op in flight; its last op was all_reduce #1 on world");
}

TEST(MpiFault, WatchdogCatchesADifferentCollectiveWithoutTheHeaderCheck) {
  auto r = run_fault("different-nocheck");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(r.time_s, kEndsWithinS);
  expect_has(r.output, "rank 3 is in all_gather #2 on world");
  expect_has(r.output, "the others in all_reduce #2");
}

TEST(MpiFault, HeaderCheckReportsADifferentCollective) {
  auto r = run_fault("different");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  expect_has(r.output, "collective mismatch on world");
  expect_has(r.output, "all_gather #2");
}

}  // namespace
}  // namespace mt::comm

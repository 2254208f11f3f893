// The watchdog and mismatch reports on the local backend: each faulty job runs as a child
// process (this binary re-invoked with MT_COMM_FAULT set) and must end within the timeout
// + 5 s, with exit code 1 and the diagnosis on stderr.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "comm/launch.h"
#include "comm/mesh.h"
#include "comm_subprocess.h"
#include "core/error.h"

namespace mt::comm {
namespace {

constexpr double kTimeoutS = 1.5;

void child_job(const std::string& fault) {
  LaunchOptions o;
  o.backend = BackendKind::kLocal;
  o.world_size = 4;
  o.timeout_s = kTimeoutS;
  launch(o, [&](Group& world) {
    DeviceMesh mesh(world, MeshShape({{"dp", 2}, {"tp", 2}}, 4));  // world ops #1..#5
    std::vector<float> x(1000, 1.0f), y(4000);
    world.all_reduce(Buf(x.data(), 1000));  // #6
    if (fault == "skip") {
      // Rank 2 skips world all_reduce #7 and goes on to its tp group, where rank 3 is
      // still in the world's #7: nobody can finish.
      if (world.rank() != 2) world.all_reduce(Buf(x.data(), 1000));
      mesh.group("tp").all_reduce(Buf(x.data(), 1000));
    } else if (fault == "different") {
      if (world.rank() == 3)
        world.all_gather(Buf(x.data(), 1000), Buf(y.data(), 4000));
      else
        world.all_reduce(Buf(x.data(), 1000));
    } else if (fault == "stuck") {
      // Rank 1 never comes back from "computation"; the others wait in all_reduce #7.
      if (world.rank() == 1)
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
      world.all_reduce(Buf(x.data(), 1000));
    } else if (fault == "recv") {
      // Rank 0 waits for a message rank 1 never sends.
      if (world.rank() == 0) world.recv(Buf(x.data(), 10), 1, 5);
      if (world.rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(30));
    }
  });
}

TEST(WatchdogChild, Run) {
  const char* fault = std::getenv("MT_COMM_FAULT");
  if (!fault) return;  // the child process's entry point; CTest does not list it
  try {
    child_job(fault);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    std::fflush(stderr);
    std::_Exit(e.exit_code());
  }
  std::_Exit(0);
}

testing::ChildResult run_fault(const std::string& fault) {
  return testing::run_child("MT_COMM_FAULT=" + fault + " " + testing::self_exe() +
                            " --gtest_filter=WatchdogChild.Run");
}

void expect_has(const std::string& out, const std::string& what) {
  EXPECT_NE(out.find(what), std::string::npos) << "missing: " << what << "\n--- output:\n" << out;
}

TEST(Watchdog, CatchesARankThatSkipsACollective) {
  auto r = run_fault("skip");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_LT(r.time_s, kTimeoutS + 5);
  expect_has(r.output, "comm watchdog: all_reduce #");
  expect_has(r.output, "not done after");
  expect_has(r.output, "arrived at all_reduce #7: ranks [0, 1, 3]; not arrived: ranks [2]");
  expect_has(r.output, "rank 2 is in all_reduce #1 on tp[1]");
}

TEST(Watchdog, ReportsARankInADifferentCollective) {
  auto r = run_fault("different");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_LT(r.time_s, kTimeoutS + 5);
  expect_has(r.output, "rank 3 is in all_gather #7 on world, the others in all_reduce #7");
}

TEST(Watchdog, EndsTheJobWhenARankIsStuckOutsideCommunication) {
  auto r = run_fault("stuck");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_LT(r.time_s, kTimeoutS + 5);
  expect_has(r.output, "arrived at all_reduce #7: ranks [0, 2, 3]; not arrived: ranks [1]");
  expect_has(r.output, "rank 1 has no op in flight; its last op was all_reduce #6 on world");
}

TEST(Watchdog, DiagnosesAReceiveThatNoRankSends) {
  auto r = run_fault("recv");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_LT(r.time_s, kTimeoutS + 5);
  expect_has(r.output, "recv #1 on world from 1 (tag 5)");
  expect_has(r.output, "its peer, world rank 1, has no op in flight");
}

}  // namespace
}  // namespace mt::comm

// The processor-sharing replay (plan/pipeline.h replay_shared): with constant speed it is
// the runtime's replay; with shared cores the idle ranks' share goes to the busy ones; and on
// a this-host cluster the planner's pipeline steps sit between the total-work floor and the
// dedicated-core replay.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "plan/pipeline.h"
#include "plan/plan_test_util.h"
#include "plan/planner.h"

namespace mt::plan {
namespace {

// Costs that differ by rank, chunk and kind, so no two actions tie by accident.
double uneven_cost(int rank, const PipeAction& a) {
  const double base = 1.0 + 0.13 * rank + 0.07 * a.chunk + 0.011 * a.microbatch;
  switch (a.kind) {
    case PipeKind::kForward:
      return base;
    case PipeKind::kBackward:
      return 2.1 * base;
    default:
      return 1.05 * base;  // zero-bubble's input and weight halves
  }
}

TEST(SharedReplay, ConstantSpeedIsTheRuntimesReplay) {
  struct Case {
    const char* schedule;
    int pp, v, m;
  };
  for (const Case& c :
       {Case{"gpipe", 4, 1, 6}, Case{"1f1b", 4, 1, 8}, Case{"1f1b", 3, 1, 3},
        Case{"interleaved", 4, 2, 8}, Case{"interleaved", 2, 3, 4}, Case{"zb1", 4, 1, 8}}) {
    SCOPED_TRACE(testing::Message()
                 << c.schedule << " pp " << c.pp << " v " << c.v << " m " << c.m);
    const PipeSchedule s = make_schedule(c.schedule, c.pp, c.v, c.m);
    for (double p2p : {0.0, 0.37}) {
      const ReplayResult plain = replay(s, uneven_cost, p2p, P2p::kAsync, true);
      const ReplayResult shared = replay_shared(
          s, uneven_cost, p2p, [](int) { return 1.0; }, true);
      EXPECT_NEAR(shared.makespan_s, plain.makespan_s, 1e-9 * plain.makespan_s);
      ASSERT_EQ(shared.busy_s.size(), plain.busy_s.size());
      for (size_t r = 0; r < plain.busy_s.size(); ++r) {
        EXPECT_NEAR(shared.busy_s[r], plain.busy_s[r], 1e-9 * plain.makespan_s);
        ASSERT_EQ(shared.spans[r].size(), plain.spans[r].size());
        for (size_t k = 0; k < plain.spans[r].size(); ++k) {
          EXPECT_EQ(shared.spans[r][k].action, plain.spans[r][k].action);
          EXPECT_NEAR(shared.spans[r][k].start_s, plain.spans[r][k].start_s, 1e-9);
          EXPECT_NEAR(shared.spans[r][k].end_s, plain.spans[r][k].end_s, 1e-9);
        }
      }
    }
  }
}

TEST(SharedReplay, IdleRanksLendTheirCores) {
  // GPipe over two stages and two microbatches, forward 1 and backward 2 per stage; dedicated
  // cores: 9. A pool that runs two ranks at 1 each or one rank at up to 2 (speed 2 / active)
  // is never idle while anyone computes: the step is the work over two, 6.
  const PipeSchedule s = make_schedule("gpipe", 2, 1, 2);
  auto cost = [](int, const PipeAction& a) { return a.kind == PipeKind::kForward ? 1.0 : 2.0; };
  EXPECT_DOUBLE_EQ(replay(s, cost, 0).makespan_s, 9.0);
  const ReplayResult pool = replay_shared(s, cost, 0, [](int active) { return 2.0 / active; });
  EXPECT_DOUBLE_EQ(pool.makespan_s, 6.0);
  EXPECT_DOUBLE_EQ(pool.busy_s[0], 6.0);  // work, in cost units
  EXPECT_DOUBLE_EQ(pool.busy_s[1], 6.0);
  // A rank alone capped at 1.5 (its threads): rank 0's first forward alone 0 → 2/3; both
  // forwards together to 5/3; rank 1's second forward alone to 7/3 and its first backward
  // alone to 11/3; a backward on each rank together to 17/3; rank 0's last backward alone
  // to 7.
  auto capped = [](int active) { return std::min(1.5, 2.0 / active); };
  const ReplayResult r = replay_shared(s, cost, 0, capped, true);
  EXPECT_NEAR(r.makespan_s, 7.0, 1e-12);
  EXPECT_NEAR(r.spans[1][0].start_s, 2.0 / 3, 1e-12);
  EXPECT_NEAR(r.spans[1][0].end_s, 5.0 / 3, 1e-12);
  EXPECT_NEAR(r.spans[1][1].end_s, 7.0 / 3, 1e-12);
  EXPECT_NEAR(r.spans[1][2].end_s, 11.0 / 3, 1e-12);
  EXPECT_NEAR(r.spans[0][2].start_s, 11.0 / 3, 1e-12);
  EXPECT_NEAR(r.spans[0][3].end_s, 7.0, 1e-12);
  // Messages 0.25 in flight hold their receivers while the sender runs alone; worked by
  // hand (in 24ths: forwards end 16, 37, 43, 59; backwards 91, 136, 142, 174): 7.25.
  EXPECT_NEAR(replay_shared(s, cost, 0.25, capped).makespan_s, 174.0 / 24, 1e-12);
}

TEST(SharedReplay, ThisHostPipelinesAbsorbTheirBubble) {
  // The runtime-comparison layout dp 2 x pp 4 (bench/plan-vs-runtime) on a host of
  // two cores: 8 rank threads, one thread each.
  const Job j = test::runtime_tiny_job(8);
  Layout l;
  l.dp = 2;
  l.pp = 4;
  l.microbatch = 2;
  l.schedule = "1f1b";
  const Estimate e = estimate(j, l);
  // Floor: the eight ranks' work on two cores, i.e. the average rank's work at 1/8 of the
  // host. (The busiest rank's work at that rate, forward_s + backward_s, is no floor: it
  // runs faster while the others idle.)
  const double mean_busy =
      std::accumulate(e.replay.busy_s.begin(), e.replay.busy_s.end(), 0.0) / l.pp;
  EXPECT_GE(e.pipeline_s, mean_busy - 1e-12);
  EXPECT_LE(mean_busy, e.forward_s + e.backward_s);
  // With dedicated cores 1F1B idles (P - 1) / (m + P - 1) = 3/7 of the pipeline; sharing
  // gives that time to the busy ranks, so little is left.
  EXPECT_LT(e.bubble_fraction, 0.10);
  EXPECT_LT(e.pipeline_s, 1.1 * mean_busy + 8 * e.pp_comm_s);
  // The search replays it the same way.
  SearchPins pins;
  pins.dp = 2;
  pins.tp = 1;
  pins.pp = 4;
  pins.microbatch = 2;
  pins.zero = 0;
  pins.recompute = Recompute::kNone;
  pins.sp = false;
  pins.schedule = "1f1b";
  pins.virtual_stages = 1;
  const SearchResult res = search(j, pins, 1);
  ASSERT_EQ(res.top.size(), 1u);
  EXPECT_DOUBLE_EQ(res.top[0].step_time_s, e.step_time_s);
}

TEST(SharedReplay, SearchPruningKeepsTheBestOnUnevenSplits) {
  // The search replays layouts in order of a lower bound and stops once the bound passes the
  // k-th best, so the bound must never exceed a layout's step. On a shared host a rank with
  // more layers than the others runs faster while they idle: its all-busy work is no floor.
  // Asking for the best 1 or for all of them must give the same winner.
  for (int64_t layers : {3, 5, 7, 11})
    for (int64_t gpus : {4, 8}) {
      SCOPED_TRACE(fmt::format("{} layers, {} ranks", layers, gpus));
      Job j = test::runtime_tiny_job(gpus);
      j.model.n_layer = layers;
      j.batch = 64;
      const SearchResult one = search(j, SearchPins{}, 1), all = search(j, SearchPins{}, 100000);
      ASSERT_FALSE(one.top.empty());
      EXPECT_EQ(one.top[0].step_time_s, all.top[0].step_time_s);
    }
}

}  // namespace
}  // namespace mt::plan

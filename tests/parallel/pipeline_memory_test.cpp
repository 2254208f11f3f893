// Memory of the pipeline executor: activation buffers are allocated on first need (during
// the first step) and kept, so the accounting allocator's peak of the activations category
// counts exactly the buffers the schedule needed at once. Checked against the formulas of
// docs/pipeline.md: m for GPipe, pp − rank for 1F1B, pp for ZB-H1, Megatron's warm-up + 1
// for interleaved; and nothing is allocated after the first step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include "core/memory.h"
#include "pipeline_test_util.h"

namespace mt::train {
namespace {

int expected_peak(const std::string& schedule, int P, int m, int v, int r) {
  if (schedule == "gpipe") return m;
  if (schedule == "1f1b") return P - r;
  if (schedule == "zb1") return P;
  return std::min((P - r - 1) * 2 + (v - 1) * P + 1, v * m);
}

class PipelineMemory : public ::testing::TestWithParam<std::string> {};

TEST_P(PipelineMemory, MicrobatchesHeldPerRankMatchTheFormula) {
  const std::string schedule = GetParam();
  const int P = 4, m = 8, v = schedule == "interleaved" ? 2 : 1;
  const TrainResult r = run_training(test::pp_options(P, m, schedule, v, 3));
  ASSERT_EQ(r.pipeline.size(), static_cast<size_t>(P));
  EXPECT_EQ(r.allocations_after_first_step, 0);
  for (const PipelineRankStats& s : r.pipeline) {
    const int want = expected_peak(schedule, P, m, v, s.pp_rank);
    EXPECT_EQ(s.schedule_peak, want) << "rank " << s.pp_rank;
    EXPECT_EQ(s.held_peak, want) << "rank " << s.pp_rank;
    // The allocator's measure: the activations peak is whole buffers, as many as were held
    // at once, plus at most one for a receive posted early while a released buffer's last
    // send was still in flight.
    ASSERT_GT(s.buffer_bytes, 0);
    EXPECT_EQ(s.activation_peak_bytes % s.buffer_bytes, 0);
    const int64_t buffers = s.activation_peak_bytes / s.buffer_bytes;
    EXPECT_EQ(buffers, s.pool_buffers);
    EXPECT_GE(buffers, want) << "rank " << s.pp_rank;
    EXPECT_LE(buffers, want + 1) << "rank " << s.pp_rank;
    std::printf("%s rank %d: formula %d, held %d, allocator %lld buffers of %lld bytes\n",
                schedule.c_str(), s.pp_rank, want, s.held_peak, static_cast<long long>(buffers),
                static_cast<long long>(s.buffer_bytes));
  }
}

INSTANTIATE_TEST_SUITE_P(Schedules, PipelineMemory,
                         ::testing::Values("gpipe", "1f1b", "interleaved", "zb1"));

}  // namespace
}  // namespace mt::train

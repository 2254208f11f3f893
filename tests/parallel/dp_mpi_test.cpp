// Under mpirun (-np 8, see tests/CMakeLists.txt): DP = world size with ZeRO 0 and 3 on the
// mpi backend trains the same model as the single-rank run (computed on rank 0 with the
// local backend). Tolerances as in dp_equiv_test.cpp.
#include <gtest/gtest.h>

#include <cstdlib>

#include "comm/launch.h"
#include "dp_test_util.h"

namespace mt::train {
namespace {

TEST(DpMpi, Zero0And3MatchTheSingleRank) {
  ASSERT_TRUE(comm::started_by_mpirun()) << "run under mpirun";
  const int N = test::env_int("OMPI_COMM_WORLD_SIZE", 1),
            rank = test::env_int("OMPI_COMM_WORLD_RANK", 0);
  ASSERT_GE(N, 2);
  ASSERT_EQ(8 % N, 0) << "the batch of 8 must divide over " << N << " ranks";
  for (int zero : {0, 3}) {
    TrainOptions o = test::dp_options(N, zero, 10);
    o.backend = "mpi";
    const TrainResult r = run_training(o);
    if (rank != 0) continue;
    const TrainResult ref = run_training(test::dp_options(1, 0, 10));
    ASSERT_EQ(r.steps.size(), ref.steps.size());
    for (size_t i = 0; i < r.steps.size(); ++i)
      EXPECT_NEAR(r.steps[i].loss, ref.steps[i].loss, 5e-5) << "zero " << zero << " step " << i + 1;
    EXPECT_LT(test::max_abs_diff(r.final_params, ref.final_params), 5e-5) << "zero " << zero;
    std::printf("mpi dp %d zero %d: max |param diff| %.2e\n", N, zero,
                test::max_abs_diff(r.final_params, ref.final_params));
  }
}

}  // namespace
}  // namespace mt::train

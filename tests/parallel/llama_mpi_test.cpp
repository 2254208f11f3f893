// Under mpirun (-np 8, see tests/CMakeLists.txt): the 3D tests' Llama (grouped-query
// attention, rotary positions, SwiGLU) in dp 2 x tp 2 x pp 2 with ZeRO-1 and 1F1B, and with
// ZeRO-3, the interleaved schedule and sp, on the mpi backend, trains the same model as the
// single rank (computed on rank 0 with the local backend). Tolerances as in
// parallel3d_equiv_test.cpp.
#include <gtest/gtest.h>

#include <cstdlib>

#include "comm/launch.h"
#include "parallel3d_test_util.h"

namespace mt::train {
namespace {

TrainOptions llama(const test::Layout3d& l) {
  TrainOptions o = test::options3d(l, 10);
  test::make_llama3d(o.model);
  return o;
}

TEST(LlamaMpi, Dp2Tp2Pp2MatchesTheSingleRank) {
  ASSERT_TRUE(comm::started_by_mpirun()) << "run under mpirun";
  ASSERT_EQ(test::env_int("OMPI_COMM_WORLD_SIZE", 1), 8) << "run with mpirun -np 8";
  for (const test::Layout3d& l :
       {test::Layout3d{2, 2, 2, 1}, test::Layout3d{2, 2, 2, 3, "interleaved", 2, true}}) {
    test::train_mpi_against_oracle(llama(l), llama({}), "llama " + test::name_of(l));
  }
}

}  // namespace
}  // namespace mt::train

// Under mpirun (-np 8, see tests/CMakeLists.txt): dp 2 x tp 2 x pp 2 with ZeRO-1 and the
// 1F1B schedule, and with ZeRO-3 and the interleaved schedule, on the mpi backend, train
// the same model as the single rank (computed on rank 0 with the local backend).
// Tolerances as in parallel3d_equiv_test.cpp.
#include <gtest/gtest.h>

#include <cstdlib>

#include "comm/launch.h"
#include "parallel3d_test_util.h"

namespace mt::train {
namespace {

TEST(Parallel3dMpi, Dp2Tp2Pp2MatchesTheSingleRank) {
  ASSERT_TRUE(comm::started_by_mpirun()) << "run under mpirun";
  ASSERT_EQ(test::env_int("OMPI_COMM_WORLD_SIZE", 1), 8) << "run with mpirun -np 8";
  for (const test::Layout3d& l :
       {test::Layout3d{2, 2, 2, 1}, test::Layout3d{2, 2, 2, 3, "interleaved", 2, true}}) {
    // Every process writes the demo data into its own scratch directory; rank 0 exports.
    test::train_mpi_against_oracle(test::options3d(l, 10), test::options3d({}, 10),
                                   test::name_of(l));
  }
}

}  // namespace
}  // namespace mt::train

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
  const int rank = test::env_int("OMPI_COMM_WORLD_RANK", 0);
  for (const test::Layout3d& l :
       {test::Layout3d{2, 2, 2, 1}, test::Layout3d{2, 2, 2, 3, "interleaved", 2, true}}) {
    TrainOptions o = llama(l);
    o.backend = "mpi";
    o.export_path = test::dir3d() / "llama_layout.safetensors";
    const TrainResult r = run_training(o);
    if (rank != 0) continue;
    TrainOptions ref_opts = llama({});
    ref_opts.export_path = test::dir3d() / "llama_oracle.safetensors";
    const TrainResult ref = run_training(ref_opts);
    ASSERT_EQ(r.steps.size(), ref.steps.size());
    for (size_t i = 0; i < r.steps.size(); ++i)
      EXPECT_NEAR(r.steps[i].loss, ref.steps[i].loss, 5e-5)
          << test::name_of(l) << " step " << i + 1;
    const double pd = test::max_weight_diff(o.export_path, ref_opts.export_path, nullptr);
    EXPECT_LT(pd, 5e-5) << test::name_of(l);
    std::printf("mpi llama %s: max |weight diff| %.2e\n", test::name_of(l).c_str(), pd);
  }
}

}  // namespace
}  // namespace mt::train

// Under mpirun (-np 8, see tests/CMakeLists.txt): context parallelism across processes, dp 2
// x cp 2 x tp 2 on the mpi backend (its point-to-point ring and its collectives), trains the
// same model as the single rank (computed on rank 0 with the local backend and the naive
// attention kernel): the 3D tests' Llama (rotary positions, grouped-query heads) with the
// ring and ZeRO-1, and with the all-to-all (Ulysses) exchange, sp and ZeRO-3; GPT-2
// (learned positions) with the all-gather exchange. Tolerances as in cp_equiv_test.cpp.
#include <gtest/gtest.h>

#include <cstdlib>

#include "comm/launch.h"
#include "parallel3d_test_util.h"

namespace mt::train {
namespace {

struct MpiCp {
  test::Layout3d l;
  std::string comm;
  bool llama = true;
};

// dp 2 x tp 2 (x cp 2 below), by a function: GCC 12 warns that designated initialisers of
// Layout3d leave its string "maybe uninitialized".
MpiCp mpi_cp(const std::string& comm, int zero, bool sp, bool llama) {
  MpiCp c;
  c.l.dp = 2;
  c.l.tp = 2;
  c.l.zero = zero;
  c.l.sp = sp;
  c.comm = comm;
  c.llama = llama;
  return c;
}

TrainOptions options(const test::Layout3d& l, bool llama) {
  TrainOptions o = test::options3d(l, 10);
  if (llama) test::make_llama3d(o.model);
  return o;
}

TEST(CpMpi, Dp2Cp2Tp2MatchesTheSingleRank) {
  ASSERT_TRUE(comm::started_by_mpirun()) << "run under mpirun";
  ASSERT_EQ(test::env_int("OMPI_COMM_WORLD_SIZE", 1), 8) << "run with mpirun -np 8";
  const int rank = test::env_int("OMPI_COMM_WORLD_RANK", 0);
  for (const MpiCp& c : {mpi_cp("ring", 1, false, true), mpi_cp("a2a", 3, true, true),
                         mpi_cp("all-gather", 0, false, false)}) {
    const std::string name = (c.llama ? "llama_" : "gpt_") + c.comm + "_" + test::name_of(c.l);
    TrainOptions o = options(c.l, c.llama);
    o.backend = "mpi";
    o.cp = 2;
    o.cp_comm = c.comm;
    o.export_path = test::dir3d() / "cp_layout.safetensors";
    const TrainResult r = run_training(o);
    if (rank != 0) continue;
    ASSERT_FALSE(r.steps.empty());
    EXPECT_GT(r.steps.back().cp_bytes, 0) << name;  // the attention's exchanges went over cp
    TrainOptions ref_opts = options({}, c.llama);
    ref_opts.attention = "naive";
    ref_opts.export_path = test::dir3d() / "cp_oracle.safetensors";
    const TrainResult ref = run_training(ref_opts);
    ASSERT_EQ(r.steps.size(), ref.steps.size());
    for (size_t i = 0; i < r.steps.size(); ++i) {
      // cp_equiv_test's tolerances: f32 summation order over 10-20 Adam steps.
      EXPECT_NEAR(r.steps[i].loss, ref.steps[i].loss, 5e-5) << name << " step " << i + 1;
      EXPECT_NEAR(r.steps[i].grad_norm, ref.steps[i].grad_norm, 1e-4 * ref.steps[i].grad_norm)
          << name << " step " << i + 1;
    }
    const double pd = test::max_weight_diff(o.export_path, ref_opts.export_path, nullptr);
    EXPECT_LT(pd, 5e-5) << name;
    std::printf("mpi cp %s: max |weight diff| %.2e\n", name.c_str(), pd);
  }
}

}  // namespace
}  // namespace mt::train

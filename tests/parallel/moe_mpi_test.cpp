// Under mpirun (-np 8, see tests/CMakeLists.txt): the MoE tests' model with expert
// parallelism on the mpi backend, ep 4 carved from dp 8 with ZeRO-1, and ep 2 x tp 2 (+ sp)
// x pp 2 with ZeRO-3 (also with --moe-shadow), trains the same model as the single rank (computed
// on rank 0 with the local backend). Tolerances as in moe_equiv_test.cpp (equiv_check.h's f32
// ones).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "comm/launch.h"
#include "moe_test_util.h"
#include "train/verify.h"

namespace mt::train {
namespace {

TEST(MoeMpi, ExpertParallelLayoutsMatchTheSingleRank) {
  ASSERT_TRUE(comm::started_by_mpirun()) << "run under mpirun";
  ASSERT_EQ(test::env_int("OMPI_COMM_WORLD_SIZE", 1), 8) << "run with mpirun -np 8";
  const int rank = test::env_int("OMPI_COMM_WORLD_RANK", 0);
  test::Layout3d folded{8, 1, 1, 1};
  folded.ep = 4;
  test::Layout3d composed{2, 2, 2, 3, "1f1b", 1, true};
  composed.ep = 2;
  // The composed layout twice: the second with --moe-shadow (its uneven all_gather of
  // weights and reduce_scatter of gradients over MPI), which must have shadowed.
  for (const auto& [l, shadow] :
       {std::pair{folded, false}, std::pair{composed, false}, std::pair{composed, true}}) {
    const test::MpiAgainstOracle m = test::train_mpi_against_oracle(
        test::moe_options(l, 10, "f32", {0, false, shadow}), test::moe_options({}, 10, "f32", {}),
        "moe " + test::name_of(l) + (shadow ? " shadow" : ""));
    if (rank != 0) continue;
    EXPECT_GT(m.layout.steps.back().ep_bytes, 0) << "the tokens went over the ep groups";
    double shadowed = 0;
    for (const StepRecord& s : m.layout.steps) shadowed += s.moe_shadowed;
    if (shadow) {
      EXPECT_GT(shadowed, 0) << "no expert was shadowed";
    }
    std::printf("mpi moe %s%s: ep bytes/step %.0f, experts shadowed per microbatch %.2f\n",
                test::name_of(l).c_str(), shadow ? " shadow" : "", m.layout.steps.back().ep_bytes,
                shadowed / static_cast<double>(m.layout.steps.size()));
  }
}

// verify under mpirun with capacity 1.0 (routing decides what is dropped): every process
// records its microbatches' routing, rank 0 gathers it and the oracle replays it. The oracle
// replays every microbatch of every layer and stops with an error at the first record
// missing, so a process whose tape did not arrive fails the run; the count is exact: 10 steps
// x 8 microbatches (global batch 16 in microbatches of 2) x 4 MoE layers. (In this layout
// no routing choice flips on rounding, so it also passes without the replay; the local
// MoeRoutingReplay test has layouts that fail without it.)
TEST(MoeMpi, VerifyReplaysTheRoutingGatheredFromEveryProcess) {
  ASSERT_TRUE(comm::started_by_mpirun()) << "run under mpirun";
  const int rank = test::env_int("OMPI_COMM_WORLD_RANK", 0);
  test::Layout3d folded{8, 1, 1, 1};
  folded.ep = 4;
  TrainOptions o = test::moe_options(folded, 10, "f32", {1.0});
  o.backend = "mpi";
  const VerifyReport r = run_verify(o, oracle_options(o), VerifyTolerances{});
  if (rank != 0) return;
  EXPECT_EQ(r.routing_records, 10u * 8u * 4u);
  EXPECT_TRUE(r.pass()) << "loss " << r.worst_loss_rel() << ", norm " << r.worst_grad_norm_rel()
                        << ", params " << r.params.abs_diff;
  std::printf(
      "mpi verify with replay (dp 8, ep 4, capacity 1.0): loss %.2e, norm %.2e, params "
      "%.2e (%zu records)\n",
      r.worst_loss_rel(), r.worst_grad_norm_rel(), r.params.abs_diff, r.routing_records);
}

}  // namespace
}  // namespace mt::train

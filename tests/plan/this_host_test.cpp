// The this-host cluster (`meshtrain calibrate`): links by the job's rank count, the preset's
// JSON round trip, and collectives that share the cores with compute (nothing overlaps).
#include <gtest/gtest.h>

#include "plan/hardware.h"
#include "plan/plan_test_util.h"
#include "plan/planner.h"

namespace mt::plan {
namespace {

using test::shared_host;

TEST(ThisHost, LinksFollowTheJobsRankCount) {
  const ClusterSpec c = shared_host();
  EXPECT_DOUBLE_EQ(c.for_job(2).intra_bytes_per_s, 8e9);
  EXPECT_DOUBLE_EQ(c.for_job(4).inter_latency_s, 2e-6);
  EXPECT_DOUBLE_EQ(c.for_job(8).intra_bytes_per_s, 2e9);
  // Between measured counts: linear; beyond them: the nearest.
  EXPECT_DOUBLE_EQ(c.for_job(6).intra_bytes_per_s, 3.5e9);
  EXPECT_DOUBLE_EQ(c.for_job(6).intra_latency_s, 3e-6);
  EXPECT_DOUBLE_EQ(c.for_job(1).intra_bytes_per_s, 8e9);
  EXPECT_DOUBLE_EQ(c.for_job(64).intra_latency_s, 4e-6);
  // A GPU cluster has no host links: unchanged.
  const ClusterSpec a100 = cluster_preset("dgx-a100");
  EXPECT_EQ(a100.for_job(1024).inter_bytes_per_s, a100.inter_bytes_per_s);
}

TEST(ThisHost, PresetJsonKeepsBackendAndLinks) {
  const ClusterSpec c = shared_host();
  const ClusterSpec back = cluster_from_json(to_json(c));
  EXPECT_EQ(back.backend, "local");
  ASSERT_EQ(back.host_links.size(), 3u);
  EXPECT_EQ(back.host_links[2].ranks, 8);
  EXPECT_DOUBLE_EQ(back.host_links[1].bytes_per_s, 5e9);
  EXPECT_DOUBLE_EQ(back.for_job(6).intra_bytes_per_s, 3.5e9);
}

TEST(ThisHost, CollectivesShareTheCoresSoNothingOverlaps) {
  const Job j = test::runtime_tiny_job(8);
  Layout l;
  l.dp = 8;
  l.microbatch = 2;
  const Estimate shared = estimate(j, l);
  // The 8-rank link, and the whole reduction after backward.
  EXPECT_GT(shared.dp_comm_s, 0);
  EXPECT_DOUBLE_EQ(shared.dp_exposed_s, shared.dp_comm_s);
  Job at_two = j;
  at_two.cluster.host_links = {{2, 1e-6, 8e9}};  // as if 8 ranks moved bytes like 2
  EXPECT_GT(shared.dp_comm_s, 3 * estimate(at_two, l).dp_comm_s);
  // On GPUs the same reduction hides behind the last backward.
  Job gpus = j;
  gpus.cluster = cluster_preset("dgx-a100");
  const Estimate hidden = estimate(gpus, l);
  EXPECT_LT(hidden.dp_exposed_s, hidden.dp_comm_s);
  // ZeRO-3's gathers and reduce-scatters add to each chunk on a shared host (the pipeline
  // grows by exactly their time over ZeRO-1's); on GPUs they hide under the compute.
  l.zero = 1;
  const Estimate z1 = estimate(j, l), z1_gpu = estimate(gpus, l);
  l.zero = 3;
  const Estimate z3 = estimate(j, l), z3_gpu = estimate(gpus, l);
  EXPECT_NEAR(z3.pipeline_s - z1.pipeline_s, z3.dp_comm_s, 1e-9 * z3.pipeline_s);
  EXPECT_LT(z3_gpu.pipeline_s - z1_gpu.pipeline_s, 0.5 * z3_gpu.dp_comm_s);
}

TEST(ThisHost, RanksThatLeaveCoresIdleGetOnlyTheirThreads) {
  // 2 ranks on 3 cores get one thread each (1/3 of the host, not 1/2): a rank computes as
  // fast as on a 2-core host of the same cores, with or without a pipeline.
  Job three = test::runtime_tiny_job(2), two = test::runtime_tiny_job(2);
  three.cluster.compute_units = 3;
  three.cluster.gpu.peak_flops_f32 = 3 * two.cluster.gpu.peak_flops_f32 / 2;
  three.cluster.gpu.hbm_bytes_per_s = 3 * two.cluster.gpu.hbm_bytes_per_s / 2;
  for (int pp : {1, 2}) {
    SCOPED_TRACE(pp);
    Layout l;
    l.dp = 2 / pp;
    l.pp = pp;
    l.microbatch = 2;
    const Estimate a = estimate(three, l), b = estimate(two, l);
    EXPECT_NEAR(a.forward_s, b.forward_s, 1e-12 * b.forward_s);
    EXPECT_NEAR(a.pipeline_s, b.pipeline_s, 1e-9 * b.pipeline_s);
  }
}

TEST(ThisHost, MpiScratchOfEachGroupCounts) {
  // Under mpi every group's backend keeps its own reduce-scatter scratch: dp 2 x tp 2 holds
  // the DP group's (2 pieces of at most 1 MiB of the stage's gradients) and the TP group's
  // (2 pieces of half a microbatch's activations).
  Job local = test::runtime_tiny_job(4), mpi = local;
  mpi.cluster.backend = "mpi";
  Layout l;
  l.dp = 2;
  l.tp = 2;
  l.microbatch = 2;
  const double extra =
      memory_per_gpu(mpi, l).communication - memory_per_gpu(local, l).communication;
  const double tp_scratch = 2 * (2.0 * 128 * 256 * 4 / 2);  // microbatch 2 x seq 128 x 256 f32
  EXPECT_NEAR(extra, 2 * double(1 << 20) + tp_scratch, 1.0);

  // pp 2: the first and the last stage all-reduce the tied embedding's gradient in a group
  // of their own (256 x 256 f32: 2 pieces of 128 KiB), measured by bench/plan-vs-runtime
  // (95.3 MB under mpi; 95.1 before this term).
  Job mpi_pp = test::runtime_tiny_job(2), local_pp = mpi_pp;
  mpi_pp.cluster.backend = "mpi";
  Layout p;
  p.pp = 2;
  p.microbatch = 4;
  const double pp_extra =
      memory_per_gpu(mpi_pp, p).communication - memory_per_gpu(local_pp, p).communication;
  EXPECT_NEAR(pp_extra, 2 * (256.0 * 256 * 4 / 2), 1.0);
}

}  // namespace
}  // namespace mt::plan

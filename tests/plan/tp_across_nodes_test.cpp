// tp across nodes (Layout::tp_across_nodes, plan --tp-across-hosts; docs/multihost.md): on
// namespace hosts as `meshtrain calibrate` measures them under mpirun (2 hosts of 2 ranks
// sharing this machine's cores, a fast link inside a host, a slow one between), tp's
// collectives take the link between hosts and dp's the one inside.
#include <gtest/gtest.h>

#include "plan/hardware.h"
#include "plan/plan_test_util.h"
#include "plan/planner.h"

namespace mt::plan {
namespace {

Job two_hosts(double inter_bytes_per_s, double inter_latency_s) {
  Job j = test::runtime_tiny_job(4);
  j.cluster.host_links.clear();
  j.cluster.gpus_per_node = 2;
  j.cluster.max_nodes = 2;
  j.cluster.backend = "mpi";
  j.cluster.intra_bytes_per_s = 4e9;
  j.cluster.intra_latency_s = 5e-6;
  j.cluster.inter_bytes_per_s = inter_bytes_per_s;
  j.cluster.inter_latency_s = inter_latency_s;
  return j;
}

Layout dp2_tp2(bool across) {
  Layout l;
  l.dp = 2;
  l.tp = 2;
  l.microbatch = 8;
  l.tp_across_nodes = across;
  return l;
}

TEST(TpAcrossNodes, TpTakesTheLinkBetweenHostsAndDpTheOneInside) {
  const Job slow = two_hosts(100e6, 100e-6);
  const Estimate inside = estimate(slow, dp2_tp2(false)), across = estimate(slow, dp2_tp2(true));
  // tp's two all-reduces per layer and pass of the activations (8 x 128 x 256 f32 = 1 MiB):
  // a 2-rank ring moves each once, at 100 MB/s about 10 ms, against 0.25 ms inside a host.
  EXPECT_GT(across.tp_comm_s, 20 * inside.tp_comm_s);
  // dp's gradients go the other way.
  EXPECT_GT(inside.dp_comm_s, 20 * across.dp_comm_s);
  EXPECT_GT(across.step_time_s, inside.step_time_s);
  // One link for both: the placement changes nothing.
  const Job same = two_hosts(4e9, 5e-6);
  EXPECT_DOUBLE_EQ(estimate(same, dp2_tp2(true)).tp_comm_s,
                   estimate(same, dp2_tp2(false)).tp_comm_s);
  EXPECT_DOUBLE_EQ(estimate(same, dp2_tp2(true)).dp_comm_s,
                   estimate(same, dp2_tp2(false)).dp_comm_s);
}

// The search keeps the pin on every layout it costs.
TEST(TpAcrossNodes, TheSearchKeepsThePin) {
  SearchPins pins;
  pins.dp = 2;
  pins.tp = 2;
  pins.tp_across_nodes = true;
  const SearchResult r = search(two_hosts(100e6, 100e-6), pins, 3);
  ASSERT_FALSE(r.top.empty());
  for (const Estimate& e : r.top) EXPECT_TRUE(e.layout.tp_across_nodes);
}

}  // namespace
}  // namespace mt::plan

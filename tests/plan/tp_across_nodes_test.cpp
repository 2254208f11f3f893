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

// The link between hosts measured by size (ClusterSpec::inter_curve, calibrate across hosts):
// read log-log between the sizes, the smallest's time below them, in proportion above them.
TEST(LinkCurve, ReadsTheMeasuredTimeAtASize) {
  LinkCurve k;
  k.ranks = 2;
  k.bytes = {1024, 4096, 65536};
  k.seconds = {1e-3, 4e-3, 8e-3};
  EXPECT_DOUBLE_EQ(k.at(4096), 4e-3);
  EXPECT_DOUBLE_EQ(k.at(512), 1e-3);
  EXPECT_DOUBLE_EQ(k.at(2 * 65536), 16e-3);
  // halfway in log size (2048 between 1024 and 4096) is the geometric mean of the times
  EXPECT_NEAR(k.at(2048), 2e-3, 1e-15);
  EXPECT_NEAR(k.at(16384), 5.656854249492380e-3, 1e-15);  // 4 ms x 2^(1/2)
}

// A curve equal to α-β changes nothing; one at twice it doubles every collective that crosses
// the hosts and nothing else: tp across the hosts (the step between hosts alone, 2 tp ranks
// on 2 hosts), dp inside. The measured 256 KiB all-reduce between namespace hosts took 12.6
// ms against α-β's 7 ms (docs/multihost.md): this is what moves the prediction there.
TEST(TpAcrossNodes, TheLinkMeasuredBySizeCostsTheCollectivesBetweenHosts) {
  const Job plain = two_hosts(60e6, 1.2e-3);
  auto with_curve = [&](double scale) {
    Job j = plain;
    j.cluster.inter_curve.ranks = 2;
    for (double b = 1024; b <= 64 << 20; b *= 2) {
      j.cluster.inter_curve.bytes.push_back(b);
      // a 2-rank ring all-reduce: 2 steps of α, each rank sends and receives half twice
      j.cluster.inter_curve.seconds.push_back(scale * (2 * 1.2e-3 + b / 60e6));
    }
    return j;
  };
  const Estimate base = estimate(plain, dp2_tp2(true));
  const Estimate same = estimate(with_curve(1), dp2_tp2(true));
  const Estimate twice = estimate(with_curve(2), dp2_tp2(true));
  ASSERT_GT(base.tp_comm_s, 0);
  EXPECT_NEAR(same.tp_comm_s, base.tp_comm_s, 1e-12 * base.tp_comm_s);
  EXPECT_NEAR(twice.tp_comm_s, 2 * base.tp_comm_s, 1e-12 * base.tp_comm_s);
  EXPECT_DOUBLE_EQ(twice.dp_comm_s, base.dp_comm_s);  // dp stays inside the hosts
  // tp inside the hosts: dp's reduction crosses them instead. Its gradient bytes fall between
  // the curve's sizes, where the log-log chord over a factor 2 overstates α-β by at most
  // 1.5% (at the knee, 2α·β = 144 KB): twice, up to 1.5% more.
  const Estimate dp_base = estimate(plain, dp2_tp2(false));
  const Estimate dp_twice = estimate(with_curve(2), dp2_tp2(false));
  ASSERT_GT(dp_base.dp_comm_s, 0);
  EXPECT_GE(dp_twice.dp_comm_s / dp_base.dp_comm_s, 2 - 1e-12);
  EXPECT_LE(dp_twice.dp_comm_s / dp_base.dp_comm_s, 2 * 1.015);
  EXPECT_DOUBLE_EQ(dp_twice.tp_comm_s, dp_base.tp_comm_s);
}

// The cluster file keeps the curve, and refuses one the model cannot read.
TEST(LinkCurve, TheClusterFileKeepsItAndRefusesABadOne) {
  Job j = two_hosts(60e6, 1.2e-3);
  j.cluster.inter_curve = {2, {1024, 262144}, {2.5e-3, 12.6e-3}};
  const ClusterSpec back = cluster_from_json(to_json(j.cluster));
  EXPECT_EQ(back.inter_curve.ranks, 2);
  EXPECT_EQ(back.inter_curve.bytes, j.cluster.inter_curve.bytes);
  EXPECT_EQ(back.inter_curve.seconds, j.cluster.inter_curve.seconds);
  EXPECT_FALSE(to_json(two_hosts(60e6, 1.2e-3).cluster).contains("inter_curve"));
  auto refused = [&](const LinkCurve& k, const std::string& says) {
    nlohmann::json f = to_json(j.cluster);
    f["inter_curve"] = {{"ranks", k.ranks}, {"bytes", k.bytes}, {"seconds", k.seconds}};
    try {
      cluster_from_json(f);
      ADD_FAILURE() << "accepted: " << f["inter_curve"].dump();
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  refused({2, {1024, 1024}, {1e-3, 2e-3}}, "must ascend");
  refused({2, {1024, 4096}, {1e-3}}, "as many seconds as bytes");
  refused({1, {1024}, {1e-3}}, "ranks >= 2");
  refused({2, {1024}, {0.0}}, "inter_curve.seconds");
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

// Placement by host (comm/hosts.h) on rank threads with made-up hosts: the world ordered host
// by host puts the mesh's fastest dimension inside a host whatever the ranks' order, and
// spans_hosts reads it off the groups as made. The multihost tests run the same on namespace
// hosts under mpirun.
#include "comm/hosts.h"

#include <gtest/gtest.h>

#include <mutex>
#include <vector>

#include "comm/launch.h"
#include "comm/mesh.h"

namespace mt::comm {
namespace {

HostMap two_hosts(const std::vector<int>& host_of_rank) {
  HostMap m;
  m.names = {"a", "b"};
  m.host_of_rank = host_of_rank;
  return m;
}

struct Seen {
  std::mutex mu;
  std::vector<std::pair<std::string, bool>> tp, dp;  // (group name, spans hosts) per rank
};

// 8 rank threads on hosts a, b, a, b, ... (mpirun --map-by node), mesh dp 2 x tp 4 with
// tp fastest, built on the world as given or ordered by host.
void run(bool ordered, const std::vector<std::string>& order, Seen& seen) {
  const HostMap hosts = two_hosts({0, 1, 0, 1, 0, 1, 0, 1});
  LaunchOptions o;
  o.backend = BackendKind::kLocal;
  o.world_size = 8;
  launch(o, [&](Group& world) {
    std::unique_ptr<Group> by_host = ordered ? order_by_host(world, hosts, "world") : nullptr;
    Group& w = by_host ? *by_host : world;
    if (ordered) {
      EXPECT_EQ(w.rank() == 0, world.rank() == 0);  // rank 0 stays rank 0
    }
    DeviceMesh mesh(w, MeshShape({{"dp", 2}, {"tp", 4}}, 8, order));
    std::lock_guard lock(seen.mu);
    seen.tp.emplace_back(mesh.group("tp").name(), spans_hosts(mesh.group("tp"), hosts));
    seen.dp.emplace_back(mesh.group("dp").name(), spans_hosts(mesh.group("dp"), hosts));
  });
}

bool any_spans(const std::vector<std::pair<std::string, bool>>& v) {
  for (const auto& [name, spans] : v)
    if (spans) return true;
  return false;
}

TEST(Hosts, OrderedByHostTpStaysInsideAHost) {
  Seen seen;
  run(/*ordered=*/true, {}, seen);
  EXPECT_FALSE(any_spans(seen.tp));
  EXPECT_TRUE(any_spans(seen.dp));
}

// The guard: without the ordering, round-robin ranks put every tp group across both hosts.
TEST(Hosts, UnorderedRoundRobinRanksPutTpAcrossHosts) {
  Seen seen;
  run(/*ordered=*/false, {}, seen);
  EXPECT_TRUE(any_spans(seen.tp));
  EXPECT_FALSE(any_spans(seen.dp));
}

// --mesh-order with tp slowest still wins: tp across, dp inside.
TEST(Hosts, MeshOrderStillDecides) {
  Seen seen;
  run(/*ordered=*/true, {"tp", "pp", "ep", "cp", "dp"}, seen);
  EXPECT_TRUE(any_spans(seen.tp));
  EXPECT_FALSE(any_spans(seen.dp));
}

TEST(Hosts, DescribesWhichDimensionsCross) {
  const HostMap h = two_hosts({0, 0, 0, 0, 1, 1, 1, 1});
  EXPECT_EQ(h.max_ranks_per_host(), 4);
  EXPECT_EQ(describe_placement({{"pp", true}, {"dp", true}, {"tp", false}}, h),
            "2 hosts (up to 4 ranks each); tp inside hosts; pp, dp across hosts");
}

// Rank threads of one process are on one host: nothing is reordered.
TEST(Hosts, RankThreadsShareOneHost) {
  LaunchOptions o;
  o.backend = BackendKind::kLocal;
  o.world_size = 3;
  launch(o, [](Group& world) {
    const HostMap m = exchange_host_names(world);
    EXPECT_EQ(m.hosts(), 1);
    EXPECT_EQ(m.names[0], this_host_name());
    EXPECT_EQ(order_by_host(world, m, "w"), nullptr);
  });
}

}  // namespace
}  // namespace mt::comm

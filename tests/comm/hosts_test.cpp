// Placement by host (comm/hosts.h): the world ordered host by host, and which mesh
// dimensions cross hosts. The multihost tests run the same on namespace hosts under mpirun.
#include "comm/hosts.h"

#include <gtest/gtest.h>

#include <vector>

#include "comm/launch.h"

namespace mt::comm {
namespace {

HostMap hosts_of(const std::vector<int>& host_of_rank) {
  HostMap m;
  for (int h : host_of_rank) {
    while (m.hosts() <= h) m.names.push_back("h" + std::to_string(m.hosts()));
    m.host_of_rank.push_back(h);
  }
  return m;
}

// mpirun --map-by node over 2 hosts of 4: ranks alternate between the hosts.
TEST(Hosts, RoundRobinRanksAreOrderedHostByHost) {
  const HostMap by_host = reorder_by_host(hosts_of({0, 1, 0, 1, 0, 1, 0, 1}));
  EXPECT_EQ(by_host.host_of_rank, (std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1}));
  EXPECT_EQ(by_host.max_ranks_per_host(), 4);
}

TEST(Hosts, TpInsideHostsDpAcrossWithTheDefaultOrder) {
  const HostMap h = hosts_of({0, 0, 0, 0, 1, 1, 1, 1});
  const MeshShape tp4({{"dp", 2}, {"tp", 4}}, 8);
  EXPECT_EQ(dims_across_hosts(tp4, h), (std::vector<std::string>{"dp"}));
  EXPECT_EQ(describe_placement(tp4, h),
            "2 hosts (up to 4 ranks each); tp inside hosts; dp across hosts");
  // tp slowest: tp across, dp inside.
  const MeshShape tp_slow({{"dp", 2}, {"tp", 4}}, 8, {"ep", "tp", "pp", "cp", "dp"});
  EXPECT_EQ(dims_across_hosts(tp_slow, h), (std::vector<std::string>{"tp"}));
}

// dp 2 x tp 2 x pp 2 on 4 hosts of 2: tp inside, dp and pp across.
TEST(Hosts, ThreeDimensionsOnFourHosts) {
  const HostMap h = hosts_of({0, 0, 1, 1, 2, 2, 3, 3});
  const MeshShape s({{"pp", 2}, {"dp", 2}, {"tp", 2}}, 8);
  EXPECT_EQ(describe_placement(s, h),
            "4 hosts (up to 2 ranks each); tp inside hosts; pp, dp across hosts");
}

// On the local backend (rank threads of one process) every rank has this host's name.
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

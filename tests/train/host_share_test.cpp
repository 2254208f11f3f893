// MFU's peak for one rank on a CPU host: its share of the cores the host's ranks share.
#include "train/host_share.h"

#include <gtest/gtest.h>

namespace mt::train {
namespace {

TEST(HostShare, RanksThatFitHaveTheirWholeThreads) {
  EXPECT_EQ(cpu_host_share(2, 1, 2), 1.0);  // one rank, both cores
  EXPECT_EQ(cpu_host_share(2, 2, 1), 1.0);  // a core each
  EXPECT_EQ(cpu_host_share(16, 4, 4), 1.0);
  EXPECT_EQ(cpu_host_share(16, 2, 4), 1.0);  // fewer threads than cores: still the threads'
}

// 4 ranks of 1 thread on 2 cores each compute on half a core: dividing by a whole core's
// peak per rank capped the reported MFU at 50% (dp 2 x pp 2 on this host showed 38.9% for
// a step the planner, at the host's peak, put at 85%).
TEST(HostShare, OversubscribedRanksShareTheCores) {
  EXPECT_EQ(cpu_host_share(2, 4, 1), 0.5);
  EXPECT_EQ(cpu_host_share(2, 8, 1), 0.25);
  EXPECT_EQ(cpu_host_share(2, 2, 2), 0.5);  // --threads 2 on 2 ranks of a 2-core host
  EXPECT_EQ(cpu_host_share(0, 0, 0), 1.0);  // unknown counts read as 1
}

}  // namespace
}  // namespace mt::train

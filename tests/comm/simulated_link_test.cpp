// comm::simulate_link (docs/diloco.md, "A shaped link"): a collective on a group with a
// simulated link lasts at least its hops x the latency + the bytes this rank receives / the
// rate, the async form too (slept on the group's progress thread while the caller goes on),
// and its result and byte counts are the unshaped group's; another group is not slowed.
#include <gtest/gtest.h>

#include <vector>

#include "comm/simulated_link.h"
#include "comm_test_util.h"
#include "core/clock.h"

namespace mt::comm {
namespace {

TEST(SimulatedLink, CollectivesLastTheirHopsAndBytes) {
  testing::run_local(4, [](Group& world) {
    std::unique_ptr<Group> plain = world.split(0, world.rank(), "plain");
    std::vector<float> x(250000, 1.0f);  // 1 MB
    auto recv_bytes = [&] { return world.recorder().bytes_of_group(world.name()).recv_bytes; };
    simulate_link(world, 1.5e7, 0.05);  // 15 MB/s and 50 ms a hop
    const int64_t b0 = recv_bytes();
    double t0 = now_s();
    world.all_reduce(Buf(x.data(), static_cast<int64_t>(x.size())));
    const double blocking = now_s() - t0;
    const double bytes = static_cast<double>(recv_bytes() - b0);
    EXPECT_EQ(bytes, 2.0 * 3 / 4 * 1e6);  // the ring's volume, as without the link
    // 6 hops of a ring all-reduce over 4 ranks: 0.3 s, and 1.5 MB at 15 MB/s: 0.1 s.
    const double model = 6 * 0.05 + bytes / 1.5e7;
    EXPECT_GE(blocking, model);
    EXPECT_EQ(x[0], 4.0f);
    EXPECT_EQ(x.back(), 4.0f);
    t0 = now_s();
    WorkPtr w = world.all_reduce_async(Buf(x.data(), static_cast<int64_t>(x.size())));
    const double issued = now_s() - t0;
    w->wait();
    EXPECT_GE(now_s() - t0, model);
    EXPECT_LT(issued, model / 2) << "the caller waited for the simulated link";
    EXPECT_EQ(x[0], 16.0f);
    // A group without the link: the same all-reduce takes well under the link's time.
    t0 = now_s();
    plain->all_reduce(Buf(x.data(), static_cast<int64_t>(x.size())));
    EXPECT_LT(now_s() - t0, model / 2);
  });
}

}  // namespace
}  // namespace mt::comm

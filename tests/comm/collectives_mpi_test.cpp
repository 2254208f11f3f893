// The mpi backend under mpirun -np 8 --oversubscribe: every collective against the same
// reference as the local backend (bitwise: both reduce in f32 in rank order), on groups of
// 1 to 8 ranks split from the world, send/recv both ways, mesh groups, byte counters.
#include <gtest/gtest.h>
#include <mpi.h>

#include "all_to_all_v_checks.h"
#include "collective_checks.h"
#include "comm/launch.h"
#include "comm/mesh.h"
#include "comm/mpi.h"
#include "core/error.h"
#include "core/memory.h"

namespace mt::comm {
namespace {

using testing::Host;

void run_mpi(const std::function<void(Group&)>& fn, bool check_headers = false) {
  LaunchOptions o;
  o.backend = BackendKind::kMpi;
  o.world_size = 0;
  o.timeout_s = 120;
  o.check_headers = check_headers;
  launch(o, fn);
}

TEST(Mpi, EveryCollectiveOnGroupsOfOneToEightRanks) {
  run_mpi([](Group& world) {
    EXPECT_EQ(world.backend_kind(), "mpi");
    for (int k = 1; k <= world.size(); ++k) {
      auto sub = world.split(world.rank() < k ? 0 : -1, world.rank(), fmt::format("first{}", k));
      if (!sub) continue;
      EXPECT_EQ(sub->size(), k);
      testing::check_all_collectives(*sub);
      testing::check_send_recv(*sub);
    }
  });
}

TEST(Mpi, AllToAllVWithZeroCountsAndSilentRanks) {
  run_mpi([](Group& world) {
    for (int k = 1; k <= world.size(); ++k) {
      auto sub = world.split(world.rank() < k ? 0 : -1, world.rank(), fmt::format("a2av{}", k));
      if (!sub) continue;
      for (uint64_t seed = 1; seed <= 3; ++seed) {
        testing::check_all_to_all_v(*sub, DType::kF32, seed);
        testing::check_all_to_all_v(*sub, DType::kBF16, seed + 10);
      }
      testing::check_all_to_all_v_vector(*sub, 21);
    }
  });
}

TEST(Mpi, HeaderCheckModeReportsNothingOnGoodCalls) {
  run_mpi([](Group& world) { testing::check_all_collectives(world); }, true);
}

TEST(Mpi, AsyncAndMeshGroupsUsedAtOnce) {
  run_mpi([](Group& world) {
    ASSERT_EQ(world.size(), 8) << "run under mpirun -np 8 (as CTest does)";
    MeshShape shape({{"pp", 2}, {"dp", 2}, {"tp", 2}}, 8);
    DeviceMesh mesh(world, shape);
    const int me = world.rank();
    for (int iter = 0; iter < 3; ++iter) {
      Host tp = Host::random(DType::kF32, 999, 20 + iter, me);
      Host dp = Host::random(DType::kBF16, 501, 40 + iter, me);
      auto w = mesh.group("tp").all_reduce_async(tp.buf());
      mesh.group({"dp", "tp"}).all_reduce(dp.buf(), ReduceOp::kAvg);
      w->wait();
      std::vector<Host> ins;
      for (int r : shape.group_ranks({"tp"}, me))
        ins.push_back(Host::random(DType::kF32, 999, 20 + iter, r));
      Host e(DType::kF32, 999);
      for (int64_t i = 0; i < 999; ++i) e.set(i, testing::reference_reduce(ins, i, ReduceOp::kSum));
      EXPECT_EQ(tp.raw, e.raw);
      ins.clear();
      for (int r : shape.group_ranks({"dp", "tp"}, me))
        ins.push_back(Host::random(DType::kBF16, 501, 40 + iter, r));
      Host e2(DType::kBF16, 501);
      for (int64_t i = 0; i < 501; ++i)
        e2.set(i, testing::reference_reduce(ins, i, ReduceOp::kAvg));
      EXPECT_EQ(dp.raw, e2.raw);
    }
  });
}

TEST(Mpi, ByteCountersEqualTheRingFormulas) {
  run_mpi([](Group& g) {
    const int n = g.size();
    const int64_t E = 840 * 3;
    const int64_t S = E * 4;
    Host a(DType::kF32, E), piece(DType::kF32, E / n), y(DType::kF32, E);
    g.recorder().reset_counters();
    g.all_reduce(a.buf());
    g.all_gather(piece.buf(), a.buf());
    g.reduce_scatter(a.buf(), piece.buf());
    g.all_to_all(a.buf(), y.buf());
    EXPECT_EQ(g.recorder().bytes("world", OpType::kAllReduce).sent_bytes, 2 * (n - 1) * S / n);
    EXPECT_EQ(g.recorder().bytes("world", OpType::kAllReduce).recv_bytes, 2 * (n - 1) * S / n);
    EXPECT_EQ(g.recorder().bytes("world", OpType::kAllGather).recv_bytes, (n - 1) * S / n);
    EXPECT_EQ(g.recorder().bytes("world", OpType::kReduceScatter).recv_bytes, (n - 1) * S / n);
    EXPECT_EQ(g.recorder().bytes("world", OpType::kAllToAll).sent_bytes, (n - 1) * S / n);
  });
}

TEST(Mpi, LargeBuffersReduceInRoundsWithBoundedScratch) {
  // Pieces of 1.2 to 2.4 MiB of f32 (uneven) arrive in rounds of at most kMpiSegmentBytes
  // from each rank; every element lands where it belongs (values exact in f32, so any
  // misplaced round or offset shows) and the backend's scratch (the communication category)
  // stays within n · kMpiSegmentBytes.
  mem::Tracker tracker;
  LaunchOptions o;
  o.backend = BackendKind::kMpi;
  o.world_size = 0;
  o.timeout_s = 120;
  o.rank_trackers = {&tracker};
  auto value = [](int rank, int64_t i) { return float((i * 31 + rank * 17) % 1009) * 0.5f; };
  auto sum = [&](int n, int64_t i) {
    float acc = 0;
    for (int r = 0; r < n; ++r) acc += value(r, i);
    return acc;
  };
  launch(o, [&](Group& g) {
    const int n = g.size(), me = g.rank();
    const int64_t E = n * 300000 + 5;
    Host a(DType::kF32, E);
    for (int64_t i = 0; i < E; ++i) a.set(i, value(me, i));
    g.all_reduce(a.buf());
    int64_t wrong = 0;
    for (int64_t i = 0; i < E; ++i) wrong += a.get(i) != sum(n, i);
    EXPECT_EQ(wrong, 0) << "all_reduce of " << E << " floats";
    // reduce_scatter with uneven counts: rank r's piece has 300000 + 100000·r floats.
    std::vector<int64_t> counts(static_cast<size_t>(n));
    int64_t total = 0, off = 0;
    for (int r = 0; r < n; ++r) {
      counts[static_cast<size_t>(r)] = 300000 + 100000 * r;
      if (r < me) off += counts[static_cast<size_t>(r)];
      total += counts[static_cast<size_t>(r)];
    }
    Host in(DType::kF32, total), piece(DType::kF32, counts[static_cast<size_t>(me)]);
    for (int64_t i = 0; i < total; ++i) in.set(i, value(me, i));
    g.reduce_scatter(in.buf(), piece.buf(), counts);
    wrong = 0;
    for (int64_t i = 0; i < piece.elems(); ++i) wrong += piece.get(i) != sum(n, off + i);
    EXPECT_EQ(wrong, 0) << "reduce_scatter piece of rank " << me;
    const int64_t scratch = tracker.snapshot().peak_of(mem::Category::kCommunication);
    EXPECT_LE(scratch, n * kMpiSegmentBytes);
    EXPECT_GT(scratch, (n - 1) * kMpiSegmentBytes);  // the largest pieces did take rounds
  });
}

// The world group outlives fn (launch destroys it after fn returns), so a tracker that fn
// scopes (the trainer's run_rank does) must not be charged with what the world group keeps:
// ~MpiBackend would free its scratch into a tracker that no longer exists. The backend and
// the group's progress thread count against the tracker current when the group was made.
TEST(Mpi, WorldScratchIsNotChargedToATrackerScopedInsideFn) {
  run_mpi([](Group& world) {
    mem::Tracker tracker;
    mem::ScopedTracker scope(tracker);
    // The first op runs on the group's progress thread and makes the scratch there; the
    // second, 4x larger and blocking with nothing queued, grows it on this thread.
    std::vector<float> v(4096, 1.0f);
    world.all_reduce_async(Buf(v.data(), 1024))->wait();
    EXPECT_EQ(tracker.snapshot().allocations, 0);
    world.all_reduce(Buf(v.data(), int64_t(v.size())));
    std::vector<float> piece(v.size() / size_t(world.size()));
    world.reduce_scatter(Buf(v.data(), int64_t(v.size())),
                         Buf(piece.data(), int64_t(piece.size())));
    EXPECT_EQ(tracker.snapshot().of(mem::Category::kCommunication), 0);
    EXPECT_EQ(tracker.snapshot().allocations, 0);
    // A group made under the scoped tracker counts its scratch there, as the trainer's mesh
    // groups do (the planner's memory model counts them per rank).
    auto sub = world.split(0, world.rank(), "sub");
    sub->all_reduce(Buf(v.data(), int64_t(v.size())));
    EXPECT_GT(tracker.snapshot().of(mem::Category::kCommunication), 0);
  });
}

}  // namespace
}  // namespace mt::comm

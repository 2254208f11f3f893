// GPU buffers in communication: the nccl backend (one GPU per rank: a world of one rank on a
// single-GPU machine; two ranks where two GPUs are) and the local backend staging GPU buffers
// through host memory (several rank threads sharing GPU 0). Every collective, both dtypes, even
// and uneven pieces, in place and not, against the same reference as the host tests, plus byte
// counters, async ops, splits and send/recv.
//
// Compiled in every build; run only where a GPU is: without CUDA a single test checks that
// --backend nccl is refused, each GPU test skips itself when no GPU is visible, and the
// two-rank NCCL tests skip themselves (saying so) with fewer than two GPUs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "collective_checks.h"
#include "comm/launch.h"
#include "core/device.h"
#include "core/error.h"

namespace mt::comm {
namespace {

using testing::check_ring_byte_counters;
using testing::Host;

#if !MESHTRAIN_CUDA

TEST(Nccl, RefusedInABuildWithoutCuda) {
  LaunchOptions o;
  o.backend = BackendKind::kNccl;
  o.world_size = 1;
  try {
    launch(o, [](Group&) {});
    FAIL() << "--backend nccl ran in a build without CUDA";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("built without CUDA"), std::string::npos) << e.what();
    EXPECT_EQ(e.code(), ExitCode::kBadInput);
  }
}

TEST(Nccl, GpuTestsNeedACudaBuild) {
  GTEST_SKIP() << "built without CUDA: the NCCL backend is not compiled (configure with "
                  "-DMESHTRAIN_CUDA=ON where nvcc is)";
}

#else

#define MT_REQUIRE_GPU()                                                       \
  do {                                                                         \
    if (device::cuda_device_count() == 0)                                      \
      GTEST_SKIP() << "no CUDA GPU: the NCCL backend is compiled but not run"; \
  } while (0)

// NCCL refuses two ranks of one communicator on one GPU: multi-rank NCCL needs k GPUs.
#define MT_REQUIRE_GPUS(k)                                                           \
  do {                                                                               \
    const int gpus_ = device::cuda_device_count();                                   \
    if (gpus_ < (k))                                                                 \
      GTEST_SKIP() << "needs " << (k) << " GPUs (NCCL: one GPU per rank), " << gpus_ \
                   << " visible: multi-rank NCCL is not run here";                   \
  } while (0)

constexpr mem::Device kGpu = mem::Device::kCuda;
constexpr mem::Device kCpu = mem::Device::kCpu;

// A device copy of a host buffer (at least 64 bytes, so even an empty one has a pointer).
struct Dev {
  DType dt = DType::kF32;
  int64_t n = 0;
  mem::Block blk;
  explicit Dev(const Host& h) : dt(h.dt), n(h.elems()) {
    blk = mem::allocate(std::max<int64_t>(64, bytes()), mem::Category::kWorkspace, kGpu);
    device::copy(blk.ptr, kGpu, h.raw.data(), kCpu, bytes());
  }
  Dev(DType t, int64_t elems) : Dev(Host(t, elems)) {}
  ~Dev() { mem::release(blk); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  int64_t bytes() const { return n * dtype_bytes(dt); }
  Buf buf(int64_t off = 0, int64_t cnt = -1) {
    return Buf(static_cast<char*>(blk.ptr) + off * dtype_bytes(dt), cnt < 0 ? n - off : cnt, dt,
               kGpu);
  }
  // What the buffer holds once the rank's stream got here (device::copy waits for it).
  Host host() const {
    Host h(dt, n);
    device::copy(h.raw.data(), kCpu, blk.ptr, kGpu, bytes());
    return h;
  }
};

using testing::offsets;
using testing::piece_counts;
using testing::reference_reduce;

void dev_all_reduce(Group& g, DType dt, ReduceOp op, bool in_place, int64_t elems) {
  const int n = g.size(), me = g.rank();
  std::vector<Host> ins;
  for (int k = 0; k < n; ++k) ins.push_back(Host::random(dt, elems, 1, k));
  Host expect(dt, elems);
  for (int64_t i = 0; i < elems; ++i) expect.set(i, reference_reduce(ins, i, op));
  Host got;
  if (in_place) {
    Dev d(ins[me]);
    g.all_reduce(d.buf(), op);
    got = d.host();
  } else {
    Dev in(ins[me]), out(dt, elems);
    g.all_reduce(in.buf(), out.buf(), op);
    EXPECT_EQ(in.host().raw, ins[me].raw) << "all_reduce changed its input";
    got = out.host();
  }
  EXPECT_EQ(got.raw, expect.raw) << "all_reduce " << reduce_name(op) << " " << dtype_name(dt)
                                 << " n=" << n << " elems=" << elems << " in_place=" << in_place
                                 << " on " << g.name() << " (" << g.backend_kind() << ")";
}

void dev_reduce_scatter(Group& g, DType dt, ReduceOp op, bool in_place, int64_t base, bool uneven) {
  const int n = g.size(), me = g.rank();
  auto counts = piece_counts(n, base, uneven);
  auto off = offsets(counts);
  std::vector<Host> ins;
  for (int k = 0; k < n; ++k) ins.push_back(Host::random(dt, off[n], 2, k));
  Host expect(dt, counts[me]);
  for (int64_t i = 0; i < counts[me]; ++i) expect.set(i, reference_reduce(ins, off[me] + i, op));
  Dev in(ins[me]);
  Host got(dt, counts[me]);
  if (in_place) {
    Buf piece = in.buf(off[me], counts[me]);
    uneven ? g.reduce_scatter(in.buf(), piece, counts, op) : g.reduce_scatter(in.buf(), piece, op);
    Host all = in.host();
    std::memcpy(got.ptr(), all.ptr(off[me]), got.raw.size());
  } else {
    Dev out(dt, counts[me]);
    uneven ? g.reduce_scatter(in.buf(), out.buf(), counts, op)
           : g.reduce_scatter(in.buf(), out.buf(), op);
    got = out.host();
  }
  EXPECT_EQ(got.raw, expect.raw) << "reduce_scatter " << dtype_name(dt) << " " << reduce_name(op)
                                 << " n=" << n << " uneven=" << uneven << " in_place=" << in_place
                                 << " (" << g.backend_kind() << ")";
}

void dev_all_gather(Group& g, DType dt, bool in_place, int64_t base, bool uneven) {
  const int n = g.size(), me = g.rank();
  auto counts = piece_counts(n, base, uneven);
  auto off = offsets(counts);
  Host expect(dt, off[n]);
  for (int k = 0; k < n; ++k) {
    Host piece = Host::random(dt, counts[k], 3, k);
    std::memcpy(expect.ptr(off[k]), piece.ptr(), piece.raw.size());
  }
  Host mine = Host::random(dt, counts[me], 3, me);
  Host got;
  if (in_place) {
    Host start(dt, off[n]);
    std::memcpy(start.ptr(off[me]), mine.ptr(), mine.raw.size());
    Dev out(start);
    Buf piece = out.buf(off[me], counts[me]);
    uneven ? g.all_gather(piece, out.buf(), counts) : g.all_gather(piece, out.buf());
    got = out.host();
  } else {
    Dev in(mine), out(dt, off[n]);
    uneven ? g.all_gather(in.buf(), out.buf(), counts) : g.all_gather(in.buf(), out.buf());
    got = out.host();
  }
  EXPECT_EQ(got.raw, expect.raw) << "all_gather " << dtype_name(dt) << " n=" << n
                                 << " uneven=" << uneven << " in_place=" << in_place << " ("
                                 << g.backend_kind() << ")";
}

void dev_broadcast(Group& g, DType dt, int root, int64_t elems) {
  Host expect = Host::random(dt, elems, 4, static_cast<uint64_t>(root));
  Dev data(g.rank() == root ? expect : Host(dt, elems));
  g.broadcast(data.buf(), root);
  EXPECT_EQ(data.host().raw, expect.raw) << "broadcast root=" << root << " n=" << g.size();
}

void dev_all_to_all(Group& g, DType dt) {
  const int n = g.size(), me = g.rank();
  std::vector<int64_t> send(n), recv(n);
  for (int d = 0; d < n; ++d) send[d] = testing::a2a_count(me, d);
  for (int s = 0; s < n; ++s) recv[s] = testing::a2a_count(s, me);
  auto soff = offsets(send);
  auto roff = offsets(recv);
  Host expect(dt, roff[n]);
  for (int s = 0; s < n; ++s) {
    std::vector<int64_t> sc(n);
    for (int d = 0; d < n; ++d) sc[d] = testing::a2a_count(s, d);
    Host theirs = Host::random(dt, offsets(sc)[n], 5, s);
    std::memcpy(expect.ptr(roff[s]), theirs.ptr(offsets(sc)[me]),
                static_cast<size_t>(recv[s] * dtype_bytes(dt)));
  }
  Dev in(Host::random(dt, soff[n], 5, me)), out(dt, roff[n]);
  g.all_to_all(in.buf(), out.buf(), send, recv);
  EXPECT_EQ(out.host().raw, expect.raw) << "all_to_all uneven n=" << n;
  const int64_t piece = 5;
  Host eexp(dt, piece * n);
  for (int s = 0; s < n; ++s) {
    Host theirs = Host::random(dt, piece * n, 6, s);
    std::memcpy(eexp.ptr(s * piece), theirs.ptr(me * piece),
                static_cast<size_t>(piece * dtype_bytes(dt)));
  }
  Dev ein(Host::random(dt, piece * n, 6, me)), eout(dt, piece * n);
  g.all_to_all(ein.buf(), eout.buf());
  EXPECT_EQ(eout.host().raw, eexp.raw) << "all_to_all equal n=" << n;
}

// Everything above with GPU buffers; results bitwise those of the host reference (a world
// of one NCCL rank copies; the local backend reduces on the host in rank order).
void check_device_collectives(Group& g) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax})
      for (bool in_place : {false, true})
        for (int64_t elems : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{4099}})
          dev_all_reduce(g, dt, op, in_place, elems);
    for (bool uneven : {false, true})
      for (bool in_place : {false, true}) {
        dev_reduce_scatter(g, dt, ReduceOp::kSum, in_place, 37, uneven);
        dev_reduce_scatter(g, dt, ReduceOp::kMax, in_place, 3, uneven);
        dev_all_gather(g, dt, in_place, 37, uneven);
        dev_all_gather(g, dt, in_place, 0, uneven);
      }
    for (int root = 0; root < g.size(); ++root) dev_broadcast(g, dt, root, 33);
    dev_all_to_all(g, dt);
  }
  g.barrier();
}

// Several async all-reduces and an all-gather queued, then a blocking barrier: they ran on
// the group's progress thread, ordered with this rank's stream through the captured stream.
void check_device_async(Group& g) {
  const int n = g.size(), me = g.rank();
  const int64_t E = 10000;
  std::vector<Host> ins;
  for (int k = 0; k < n; ++k) ins.push_back(Host::random(DType::kF32, E, 11, k));
  std::vector<std::unique_ptr<Dev> > bufs;
  for (int i = 0; i < 6; ++i) bufs.push_back(std::make_unique<Dev>(ins[me]));
  std::vector<WorkPtr> works;
  for (auto& b : bufs) works.push_back(g.all_reduce_async(b->buf()));
  Dev mine(ins[me]), gathered(DType::kF32, n * E);
  auto wg = g.all_gather_async(mine.buf(), gathered.buf());
  g.barrier();
  for (auto& w : works) EXPECT_TRUE(w->test());
  wg->wait();
  Host expect(DType::kF32, E);
  for (int64_t i = 0; i < E; ++i) expect.set(i, reference_reduce(ins, i, ReduceOp::kSum));
  for (auto& b : bufs) EXPECT_EQ(b->host().raw, expect.raw);
  Host all = gathered.host();
  for (int k = 0; k < n; ++k)
    EXPECT_EQ(0, std::memcmp(all.ptr(k * E), ins[k].ptr(), static_cast<size_t>(E * 4)));
}

void run_nccl(int n, const std::function<void(Group&)>& fn) {
  LaunchOptions o;
  o.backend = BackendKind::kNccl;
  o.world_size = n;
  o.timeout_s = 120;
  launch(o, fn);
}

// Rank threads of the local backend sharing GPU 0 (what a one-GPU machine runs for dp > 1).
void run_local_on_gpu0(int n, const std::function<void(Group&)>& fn) {
  testing::run_local(
      n,
      [&](Group& g) {
        device::use_cuda(0);
        fn(g);
      },
      120);
}

TEST(Nccl, WorldOfOneEveryCollectiveOnGpuBuffers) {
  MT_REQUIRE_GPU();
  run_nccl(1, [](Group& world) {
    EXPECT_EQ(world.backend_kind(), "nccl");
    EXPECT_EQ(world.size(), 1);
    EXPECT_EQ(world.name(), "world");
    check_device_collectives(world);
  });
}

TEST(Nccl, WorldOfOneHostBuffersRunOnTheHostTwin) {
  MT_REQUIRE_GPU();
  run_nccl(1, [](Group& world) { testing::check_all_collectives(world); });
}

TEST(Nccl, WorldOfOneByteCounters) {
  MT_REQUIRE_GPU();
  run_nccl(1, [](Group& world) { check_ring_byte_counters<Dev>(world); });
}

TEST(Nccl, WorldOfOneAsyncOps) {
  MT_REQUIRE_GPU();
  run_nccl(1, [](Group& world) { check_device_async(world); });
}

TEST(Nccl, SplitGivesAWorkingGroupAndNullForNoColor) {
  MT_REQUIRE_GPU();
  run_nccl(1, [](Group& world) {
    auto none = world.split(-1, 0, "none");
    EXPECT_TRUE(none == nullptr);
    auto sub = world.split(7, 0, "sub");
    ASSERT_TRUE(sub != nullptr);
    EXPECT_EQ(sub->backend_kind(), "nccl");
    EXPECT_EQ(sub->size(), 1);
    EXPECT_EQ(sub->world_ranks(), std::vector<int>{0});
    dev_all_reduce(*sub, DType::kF32, ReduceOp::kSum, true, 1000);
    dev_all_gather(*sub, DType::kBF16, false, 37, true);
    check_device_async(*sub);
    // The parent still works after the split, and so does a split of the split.
    dev_all_reduce(world, DType::kBF16, ReduceOp::kAvg, false, 99);
    auto subsub = sub->split(0, 0, "subsub");
    ASSERT_TRUE(subsub != nullptr);
    dev_reduce_scatter(*subsub, DType::kF32, ReduceOp::kSum, false, 11, true);
  });
}

TEST(Nccl, SendToSelfAndResultOrderedOnTheStream) {
  MT_REQUIRE_GPU();
  run_nccl(1, [](Group& world) {
    // NCCL needs a send and its receive in one group when they are on the same rank: the
    // backend issues pending sends and receives together at the first wait.
    for (int64_t elems : {int64_t{1}, int64_t{1000}, int64_t{100000}}) {
      Host h = Host::random(DType::kBF16, elems, 7, 0);
      Dev src(h), dst(DType::kBF16, elems);
      auto s = world.send_async(src.buf(), 0, 1);
      world.recv(dst.buf(), 0, 1);
      s->wait();
      EXPECT_EQ(dst.host().raw, h.raw) << elems;
    }
    EXPECT_EQ(world.recorder().bytes(world.name(), OpType::kSend).sent_bytes,
              (1 + 1000 + 100000) * 2);
    EXPECT_EQ(world.recorder().bytes(world.name(), OpType::kRecv).recv_bytes,
              (1 + 1000 + 100000) * 2);
    // Host buffers go through the host twin.
    Host a = Host::random(DType::kF32, 64, 9, 0), b(DType::kF32, 64);
    world.send_recv(a.buf(), 0, b.buf(), 0, 3);
    EXPECT_EQ(a.raw, b.raw);
  });
}

// i32 buffers (token ids) move 4 bytes an element, like the host backends' byte copies
// (the data-moving ops; reductions are f32 / bf16 only on the host backends).
TEST(Nccl, WorldOfOneInt32BuffersMoveEveryByte) {
  MT_REQUIRE_GPU();
  run_nccl(1, [](Group& world) {
    const int64_t n = 1001;
    Host h(DType::kI32, n);
    for (int64_t i = 0; i < n; ++i) {
      const int32_t v = static_cast<int32_t>(0x01020304 + 0x00010001 * i);
      std::memcpy(h.ptr(i), &v, 4);
    }
    Dev in(h), gathered(DType::kI32, n), received(DType::kI32, n);
    world.all_gather(in.buf(), gathered.buf());
    EXPECT_EQ(gathered.host().raw, h.raw) << "all_gather i32";
    world.send_recv(in.buf(), 0, received.buf(), 0);
    EXPECT_EQ(received.host().raw, h.raw) << "send/recv i32";
  });
}

// The backend's scratch lives as long as its group: it must not be counted against (and freed
// into) a tracker that fn scoped to itself and that is gone when the world is destroyed.
TEST(Nccl, ScratchIsNotChargedToATrackerScopedInsideFn) {
  MT_REQUIRE_GPU();
  run_nccl(1, [](Group& world) {
    mem::Tracker tracker;
    mem::ScopedTracker scope(tracker);
    world.barrier();  // grows the world backend's device scratch
    EXPECT_EQ(tracker.snapshot().of(mem::Category::kCommunication), 0);
  });
}

// --- Two NCCL ranks (two GPUs). With two ranks every reduction is one addition (or max) of
// two values, rounded once, so NCCL's results are bitwise those of the host reference too.

TEST(Nccl, TwoRanksEveryCollectiveOnGpuBuffers) {
  MT_REQUIRE_GPUS(2);
  run_nccl(2, [](Group& world) {
    EXPECT_EQ(world.backend_kind(), "nccl");
    EXPECT_EQ(world.size(), 2);
    check_device_collectives(world);
    check_device_async(world);
    check_ring_byte_counters<Dev>(world);
  });
}

TEST(Nccl, TwoRanksHostBuffersRunOnTheHostTwin) {
  MT_REQUIRE_GPUS(2);
  run_nccl(2, [](Group& world) {
    testing::check_all_collectives(world);
    testing::check_send_recv(world);
  });
}

// Splits are collective over the parent: a rank outside every new group (color < 0) takes
// part too (NCCL_SPLIT_NOCOLOR), and keys order the new group's ranks.
TEST(Nccl, TwoRanksSplitWithNoColorAndReversedKeys) {
  MT_REQUIRE_GPUS(2);
  run_nccl(2, [](Group& world) {
    const int me = world.rank();
    auto first = world.split(me == 0 ? 0 : -1, 0, "first");
    EXPECT_EQ(first == nullptr, me != 0);
    if (first) {
      EXPECT_EQ(first->size(), 1);
      dev_all_reduce(*first, DType::kF32, ReduceOp::kSum, false, 100);
    }
    auto rev = world.split(0, 1 - me, "reversed");
    if (rev == nullptr) {
      ADD_FAILURE() << "no group for color 0";
      return;
    }
    EXPECT_EQ(rev->rank(), 1 - me);
    EXPECT_EQ(rev->world_ranks(), (std::vector<int>{1, 0}));
    dev_all_gather(*rev, DType::kF32, false, 37, true);
    dev_reduce_scatter(*rev, DType::kBF16, ReduceOp::kSum, false, 11, true);
    dev_broadcast(*rev, DType::kF32, 0, 33);
    check_device_async(*rev);
    // The parent still works, in its own rank order.
    dev_all_gather(world, DType::kBF16, true, 5, true);
  });
}

// Both directions at once (a pipeline's send-forward / recv-backward), and several messages
// one way matched in call order.
TEST(Nccl, TwoRanksSendRecvBothWaysAndInOrder) {
  MT_REQUIRE_GPUS(2);
  run_nccl(2, [](Group& world) {
    const int me = world.rank(), other = 1 - me;
    for (int64_t elems : {int64_t{1}, int64_t{1000}, int64_t{1} << 20}) {
      Dev src(Host::random(DType::kF32, elems, 21, static_cast<uint64_t>(me)));
      Dev dst(DType::kF32, elems);
      auto s = world.send_async(src.buf(), other);
      world.recv(dst.buf(), other);
      s->wait();
      EXPECT_EQ(dst.host().raw, Host::random(DType::kF32, elems, 21, other).raw) << elems;
    }
    Host x1 = Host::random(DType::kBF16, 300, 22, 0), x2 = Host::random(DType::kBF16, 300, 23, 0);
    Host y = Host::random(DType::kBF16, 70, 24, 1);
    if (me == 0) {
      Dev a(x1), b(x2), got(DType::kBF16, 70);
      auto wa = world.send_async(a.buf(), 1);
      auto wb = world.send_async(b.buf(), 1);
      world.recv(got.buf(), 1);
      wa->wait();
      wb->wait();
      EXPECT_EQ(got.host().raw, y.raw);
    } else {
      Dev ga(DType::kBF16, 300), gb(DType::kBF16, 300), c(y);
      auto ra = world.recv_async(ga.buf(), 0);
      auto rb = world.recv_async(gb.buf(), 0);
      world.send(c.buf(), 0);
      ra->wait();
      rb->wait();
      EXPECT_EQ(ga.host().raw, x1.raw);
      EXPECT_EQ(gb.host().raw, x2.raw);
    }
    world.barrier();
  });
}

TEST(Nccl, MoreRanksThanGpusIsRefusedBeforeAnyWork) {
  MT_REQUIRE_GPU();
  const int gpus = device::cuda_device_count();
  LaunchOptions o;
  o.backend = BackendKind::kNccl;
  o.world_size = gpus + 1;
  bool ran = false;
  try {
    launch(o, [&](Group&) { ran = true; });
    FAIL() << "ran " << gpus + 1 << " NCCL ranks on " << gpus << " GPUs";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("one GPU per rank"), std::string::npos) << e.what();
    EXPECT_EQ(e.code(), ExitCode::kBadInput);
  }
  EXPECT_FALSE(ran);
}

TEST(Nccl, WithoutAGpuItIsRefusedNamingTheFix) {
  if (device::cuda_device_count() > 0) GTEST_SKIP() << "a GPU is visible: nothing to refuse";
  LaunchOptions o;
  o.backend = BackendKind::kNccl;
  o.world_size = 1;
  try {
    launch(o, [](Group&) {});
    FAIL() << "--backend nccl ran without a GPU";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA GPU"), std::string::npos) << e.what();
    EXPECT_EQ(e.code(), ExitCode::kBadInput);
  }
}

class LocalOnGpu : public ::testing::TestWithParam<int> {};

TEST_P(LocalOnGpu, EveryCollectiveStagedMatchesTheHostResult) {
  MT_REQUIRE_GPU();
  run_local_on_gpu0(GetParam(), [](Group& world) { check_device_collectives(world); });
}

TEST_P(LocalOnGpu, ByteCountersAreThoseOfTheOp) {
  MT_REQUIRE_GPU();
  run_local_on_gpu0(GetParam(), [](Group& world) { check_ring_byte_counters<Dev>(world); });
}

TEST_P(LocalOnGpu, AsyncOpsStageOnTheIssuingRanksStream) {
  MT_REQUIRE_GPU();
  run_local_on_gpu0(GetParam(), [](Group& world) { check_device_async(world); });
}

TEST_P(LocalOnGpu, StagingAllocatesNothingInTheSteadyState) {
  MT_REQUIRE_GPU();
  run_local_on_gpu0(GetParam(), [](Group& world) {
    mem::Tracker tracker;
    mem::ScopedTracker scope(tracker);
    Dev a(DType::kF32, 5000), b(DType::kF32, 5000);
    world.all_reduce(a.buf(), b.buf());  // grows the staging buffers once
    const int64_t before = tracker.snapshot().allocations;
    for (int i = 0; i < 5; ++i) {
      world.all_reduce(a.buf(), b.buf());
      world.all_reduce(b.buf());
    }
    EXPECT_EQ(tracker.snapshot().allocations, before);
  });
}

INSTANTIATE_TEST_SUITE_P(RankThreads, LocalOnGpu, ::testing::Values(2, 4));

// Pipeline activations between rank threads sharing the GPU: staged through the host.
TEST(LocalOnGpuP2p, SendRecvOfGpuBuffersIsStaged) {
  MT_REQUIRE_GPU();
  run_local_on_gpu0(2, [](Group& world) {
    const int64_t n = 1000;
    std::vector<float> host(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) host[static_cast<size_t>(i)] = float(i) + 0.5f;
    Dev a(DType::kF32, n);
    if (world.rank() == 0) {
      device::copy(a.blk.ptr, mem::Device::kCuda, host.data(), mem::Device::kCpu, n * 4);
      world.send(a.buf(), 1);
      WorkPtr w = world.send_async(a.buf(), 1, 7);
      w->wait();
    } else {
      world.recv(a.buf(), 0);
      std::vector<float> got(static_cast<size_t>(n));
      device::copy(got.data(), mem::Device::kCpu, a.blk.ptr, mem::Device::kCuda, n * 4);
      EXPECT_EQ(got, host);
      device::zero(a.blk.ptr, mem::Device::kCuda, n * 4);
      WorkPtr w = world.recv_async(a.buf(), 0, 7);
      while (!w->test()) {
      }
      device::copy(got.data(), mem::Device::kCpu, a.blk.ptr, mem::Device::kCuda, n * 4);
      EXPECT_EQ(got, host);
    }
  });
}

#endif  // MESHTRAIN_CUDA

}  // namespace
}  // namespace mt::comm

// The local backend (ranks = threads): every collective against the reference for group
// sizes 1 to 8, async forms, groups of several mesh dimensions at once, exact byte
// counters, mismatches and failures that end the job.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "all_to_all_v_checks.h"
#include "collective_checks.h"
#include "comm/launch.h"
#include "comm/mesh.h"
#include "comm/recorder.h"
#include "core/clock.h"
#include "core/error.h"

namespace mt::comm {
namespace {

using testing::check_ring_byte_counters;
using testing::Host;
using testing::run_local;

class LocalSizes : public ::testing::TestWithParam<int> {};

TEST_P(LocalSizes, EveryCollectiveMatchesTheReference) {
  run_local(GetParam(), [](Group& world) { testing::check_all_collectives(world); });
}

TEST_P(LocalSizes, SendRecvBothDirectionsAtOnce) {
  run_local(GetParam(), [](Group& world) { testing::check_send_recv(world); });
}

TEST_P(LocalSizes, AllToAllVWithZeroCountsAndSilentRanks) {
  run_local(GetParam(), [](Group& world) {
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      testing::check_all_to_all_v(world, DType::kF32, seed);
      testing::check_all_to_all_v(world, DType::kBF16, seed + 10);
    }
    testing::check_all_to_all_v_vector(world, 21);
  });
}

INSTANTIATE_TEST_SUITE_P(GroupSizes, LocalSizes, ::testing::Range(1, 9));

// Expert parallelism's dimension: an ep group of the mesh (pp, dp, ep, cp, tp) carries the
// dispatch, and the recorder counts its bytes under the group's name "ep[i]".
TEST(Local, AllToAllVOnTheEpDimensionIsCountedUnderEp) {
  run_local(8, [](Group& world) {
    MeshShape shape({{"dp", 2}, {"ep", 2}, {"tp", 2}}, world.size());
    DeviceMesh mesh(world, shape);
    Group& ep = mesh.group("ep");
    EXPECT_EQ(ep.name(), shape.group_name({"ep"}, world.rank()));
    EXPECT_EQ(ep.name().substr(0, 3), "ep[");
    EXPECT_EQ(ep.size(), 2);
    testing::check_all_to_all_v(ep, DType::kF32, 7);
    // Nothing else moved on the ep group, and the dp and tp groups saw none of it.
    EXPECT_EQ(world.recorder().bytes_of_group(mesh.group("dp").name()).sent_bytes, 0);
    EXPECT_EQ(world.recorder().bytes_of_group(mesh.group("tp").name()).sent_bytes, 0);
  });
}

TEST(Local, AsyncOpsCompleteInOrderAndMatchBlockingOnes) {
  run_local(4, [](Group& g) {
    const int64_t E = 10000;
    std::vector<Host> ins;
    for (int k = 0; k < 4; ++k) ins.push_back(Host::random(DType::kF32, E, 11, k));
    std::vector<Host> bufs(6, ins[g.rank()]);
    std::vector<WorkPtr> works;
    for (auto& b : bufs) works.push_back(g.all_reduce_async(b.buf()));
    Host gathered(DType::kF32, 4 * E);
    auto wg = g.all_gather_async(ins[g.rank()].buf(), gathered.buf());
    g.barrier();  // a blocking op waits for the async ones queued before it
    for (auto& w : works) EXPECT_TRUE(w->test());
    wg->wait();
    Host expect(DType::kF32, E);
    for (int64_t i = 0; i < E; ++i)
      expect.set(i, testing::reference_reduce(ins, i, ReduceOp::kSum));
    for (auto& b : bufs) EXPECT_EQ(b.raw, expect.raw);
    for (int k = 0; k < 4; ++k)
      EXPECT_EQ(0, std::memcmp(gathered.ptr(k * E), ins[k].ptr(), static_cast<size_t>(E * 4)));
  });
}

TEST(Local, ResultsAreBitwiseTheSameRunAfterRun) {
  std::vector<uint8_t> first;
  for (int run = 0; run < 3; ++run) {
    std::vector<uint8_t> got;
    run_local(7, [&](Group& g) {
      Host h = Host::random(DType::kF32, 12345, 13, g.rank());
      g.all_reduce(h.buf());
      if (g.rank() == 3) got = h.raw;
    });
    if (run == 0) first = got;
    EXPECT_EQ(got, first);
  }
}

TEST(Local, GroupsOfSeveralMeshDimsUsedAtOnce) {
  // pp=2 dp=2 cp=1 tp=2 on 8 ranks; the same rank uses tp, dp, {dp,tp} and pp groups,
  // interleaved, some async.
  run_local(8, [](Group& world) {
    MeshShape shape({{"pp", 2}, {"dp", 2}, {"tp", 2}}, world.size());
    DeviceMesh mesh(world, shape);
    const int me = world.rank();
    auto reference = [&](const std::vector<std::string>& dims, uint64_t seed, int64_t E) {
      std::vector<Host> ins;
      for (int r : shape.group_ranks(dims, me))
        ins.push_back(Host::random(DType::kF32, E, seed, r));
      Host e(DType::kF32, E);
      for (int64_t i = 0; i < E; ++i) e.set(i, testing::reference_reduce(ins, i, ReduceOp::kSum));
      return e;
    };
    for (int iter = 0; iter < 5; ++iter) {
      Host tp = Host::random(DType::kF32, 999, 20 + iter, me);
      Host dp = Host::random(DType::kF32, 501, 40 + iter, me);
      Host dptp = Host::random(DType::kF32, 77, 60 + iter, me);
      auto w = mesh.group("tp").all_reduce_async(tp.buf());
      mesh.group("dp").all_reduce(dp.buf());
      mesh.group({"dp", "tp"}).all_reduce(dptp.buf());
      w->wait();
      EXPECT_EQ(tp.raw, reference({"tp"}, 20 + iter, 999).raw);
      EXPECT_EQ(dp.raw, reference({"dp"}, 40 + iter, 501).raw);
      EXPECT_EQ(dptp.raw, reference({"dp", "tp"}, 60 + iter, 77).raw);
      // pp: send forward along the pipeline.
      Group& pp = mesh.group("pp");
      Host act = Host::random(DType::kBF16, 300, 80 + iter, me), got(DType::kBF16, 300);
      if (pp.rank() == 0)
        pp.send(act.buf(), 1, iter);
      else {
        pp.recv(got.buf(), 0, iter);
        EXPECT_EQ(got.raw, Host::random(DType::kBF16, 300, 80 + iter, pp.world_ranks()[0]).raw);
      }
    }
    EXPECT_EQ(mesh.group("tp").name(), shape.group_name({"tp"}, me));
    EXPECT_EQ(mesh.group("tp").size(), 2);
    EXPECT_EQ(mesh.group({"tp", "dp"}).size(), 4);
  });
}

TEST(Local, ByteCountersEqualTheRingFormulas) {
  for (int n = 1; n <= 8; ++n) run_local(n, [](Group& g) { check_ring_byte_counters<Host>(g); });
}

TEST(Local, RecorderKeepsTheLastOpsWithSequenceNumbers) {
  run_local(3, [](Group& g) {
    Host a = Host::random(DType::kBF16, 10, 1, g.rank());
    g.all_reduce(a.buf());
    g.barrier();
    auto last = g.recorder().last(2);
    ASSERT_EQ(last.size(), 2u);
    EXPECT_EQ(last[0].op, OpType::kAllReduce);
    EXPECT_EQ(last[0].seq, 1);
    EXPECT_EQ(last[0].dtype, DType::kBF16);
    EXPECT_EQ(last[0].elems, 10);
    EXPECT_EQ(last[0].state, OpState::kDone);
    EXPECT_GE(last[0].done_s, last[0].started_s);
    EXPECT_EQ(last[1].op, OpType::kBarrier);
    EXPECT_EQ(last[1].seq, 2);
    EXPECT_TRUE(g.recorder().in_flight().empty());
  });
}

// An op that leaves the ring (capacity 2) before it is done is still in flight for the
// watchdog, found by its sequence number, and counted once when it finishes.
TEST(Local, RecorderKeepsAnOpInFlightAfterItLeftTheRing) {
  FlightRecorder rec(0, 2);
  auto op = [](OpType t, int64_t seq, int64_t elems) {
    OpRecord r;
    r.group = "ep[0]";
    r.op = t;
    r.seq = seq;
    r.elems = elems;
    return r;
  };
  const int64_t slow = rec.on_queued(op(OpType::kAllToAll, 1, 8));
  rec.on_started(slow);
  for (int64_t seq = 2; seq <= 4; ++seq) {
    const int64_t id = rec.on_queued(op(OpType::kAllReduce, seq, 4));
    rec.on_started(id);
    rec.on_done(id, 16, 16);
  }
  auto flying = rec.in_flight();
  ASSERT_EQ(flying.size(), 1u);
  EXPECT_EQ(flying[0].id, slow);
  EXPECT_EQ(flying[0].state, OpState::kStarted);
  OpRecord found;
  ASSERT_TRUE(rec.find_collective("ep[0]", 1, &found));
  EXPECT_EQ(found.id, slow);
  EXPECT_EQ(rec.last(5).size(), 2u);  // the ring: ops 3 and 4
  rec.on_done(slow, 24, 32);
  EXPECT_TRUE(rec.in_flight().empty());
  EXPECT_FALSE(rec.find_collective("ep[0]", 1, &found)) << "done and out of the ring";
  EXPECT_EQ(rec.bytes("ep[0]", OpType::kAllToAll).sent_bytes, 24);
  EXPECT_EQ(rec.bytes("ep[0]", OpType::kAllToAll).recv_bytes, 32);
  EXPECT_EQ(rec.bytes("ep[0]", OpType::kAllReduce).sent_bytes, 3 * 16);
  EXPECT_EQ(rec.bytes_of_group("ep[0]").ops, 4);
}

// The ring's slots are reused in place (a circle from the oldest op on): after it wrapped
// several times it holds exactly the newest ops, oldest first, each with its own fields
// (a long group name in a slot, then a short one, reads back as the short one).
TEST(Local, RecorderRingWrapsInPlaceKeepingTheNewestOpsInOrder) {
  FlightRecorder rec(0, 3);
  for (int64_t seq = 1; seq <= 10; ++seq) {
    FlightRecorder::Start s;
    const std::string name = seq % 2 ? "ep_grads[a long group name, past SSO]" : "dp";
    s.group = &name;
    s.op = seq % 3 ? OpType::kAllReduce : OpType::kAllToAll;
    s.seq = seq;
    s.elems = 10 * seq;
    s.started = true;
    s.at = static_cast<double>(seq);
    const int64_t id = rec.on_queued(s);
    EXPECT_EQ(id, seq);
    rec.on_done(id, seq, 2 * seq);
  }
  const auto last = rec.last(5);
  ASSERT_EQ(last.size(), 3u);
  for (size_t i = 0; i < last.size(); ++i) {
    const int64_t seq = 8 + static_cast<int64_t>(i);
    EXPECT_EQ(last[i].id, seq);
    EXPECT_EQ(last[i].seq, seq);
    EXPECT_EQ(last[i].elems, 10 * seq);
    EXPECT_EQ(last[i].group, seq % 2 ? "ep_grads[a long group name, past SSO]" : "dp");
    EXPECT_EQ(last[i].state, OpState::kDone);
    EXPECT_EQ(last[i].started_s, static_cast<double>(seq));
    EXPECT_EQ(last[i].sent_bytes, seq);
  }
  OpRecord found;
  EXPECT_TRUE(rec.find_collective("dp", 10, &found));
  EXPECT_EQ(found.id, 10);
  EXPECT_FALSE(rec.find_collective("dp", 6, &found)) << "left the ring";
  EXPECT_TRUE(rec.in_flight().empty());
  EXPECT_EQ(rec.bytes_of_group("dp").ops, 5);  // every op counted once, in or out of the ring
  EXPECT_EQ(rec.bytes_of_group("dp").sent_bytes, 2 + 4 + 6 + 8 + 10);
}

TEST(Local, ADifferentCollectiveIsReportedNotCorrupting) {
  try {
    run_local(4, [](Group& g) {
      Host a(DType::kF32, 100), b(DType::kF32, 400);
      if (g.rank() == 3)
        g.all_gather(a.buf(), b.buf());
      else
        g.all_reduce(a.buf());
    });
    FAIL() << "expected a mismatch";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 3 is in all_gather #1 on world, the others in "
                                         "all_reduce #1"),
              std::string::npos)
        << e.what();
    EXPECT_EQ(e.exit_code(), 1);
  }
}

TEST(Local, MismatchedCountsAndDtypesAreReported) {
  try {
    run_local(3, [](Group& g) {
      Host a(DType::kF32, g.rank() == 1 ? 50 : 100);
      g.all_reduce(a.buf());
    });
    FAIL() << "expected a mismatch";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("element count (rank 0: 100, rank 1: 50, rank 2: 100)"),
              std::string::npos)
        << e.what();
  }
  try {
    run_local(2, [](Group& g) {
      Host a(g.rank() == 1 ? DType::kBF16 : DType::kF32, 100);
      g.all_reduce(a.buf());
    });
    FAIL() << "expected a mismatch";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dtype"), std::string::npos) << e.what();
  }
  try {
    run_local(2, [](Group& g) {
      Host a(DType::kF32, g.rank() == 1 ? 10 : 20);
      if (g.rank() == 0)
        g.send(a.buf(), 1);
      else
        g.recv(a.buf(), 0);
    });
    FAIL() << "expected a mismatch";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sends 20 f32 elems"), std::string::npos) << e.what();
  }
}

TEST(Local, MismatchedAllToAllCountsAreReported) {
  try {
    run_local(3, [](Group& g) {
      // Rank 1 expects 2 elements from rank 0, which sends it 1.
      std::vector<int64_t> send = {1, 1, 1}, recv = {1, 1, 1};
      if (g.rank() == 1) recv = {2, 1, 1};
      int64_t in_elems = 3, out_elems = g.rank() == 1 ? 4 : 3;
      Host in(DType::kF32, in_elems), out(DType::kF32, out_elems);
      g.all_to_all(in.buf(), out.buf(), send, recv);
    });
    FAIL() << "expected a mismatch";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 sends 1 elems to rank 1, but rank 1 expects 2"),
              std::string::npos)
        << e.what();
  }
}

TEST(Local, TensorsAreBuffers) {
  run_local(2, [](Group& g) {
    Tensor t = Tensor::zeros({4, 8}, DType::kBF16, mem::Category::kGradients);
    for (int64_t i = 0; i < t.numel(); ++i) t.bf16p()[i] = f32_to_bf16(float(g.rank() + 1));
    g.all_reduce(t, ReduceOp::kAvg);
    EXPECT_EQ(bf16_to_f32(t.bf16p()[31]), 1.5f);
  });
}

TEST(Local, AnExceptionInOneRankEndsTheJobPromptly) {
  double t0 = now_s();
  try {
    run_local(6, [](Group& g) {
      if (g.rank() == 4) throw Error("boom", ExitCode::kBadInput);
      Host a(DType::kF32, 10);
      g.all_reduce(a.buf());  // the others wait here until the failure aborts them
      g.barrier();
    });
    FAIL() << "expected the failure";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "[rank 4] boom");
    EXPECT_EQ(e.exit_code(), 2);
  }
  EXPECT_LT(now_s() - t0, 5.0);
}

// A rank that fails while its async all-reduce is in flight (its progress thread has posted
// the buffer): the handle, dropped by the unwinding, ends the job and waits for the op
// before the buffer is freed. The peer joins the all-reduce only after the buffer was freed:
// it must find the job ended, never complete the op by reading the freed buffer (as it did
// when the handle was dropped silently), and the rank's own error is the job's.
TEST(Local, ARankFailingWithAnAsyncOpInFlightEndsItBeforeFreeingItsBuffer) {
  std::atomic<bool> freed{false}, peer_completed{false};
  struct SetOnExit {
    std::atomic<bool>& flag;
    ~SetOnExit() { flag.store(true); }
  };
  try {
    run_local(2, [&](Group& g) {
      Host a(DType::kF32, 4096);
      if (g.rank() == 0) {
        SetOnExit mark{freed};  // destroyed after the buffer and the handle
        Host buf(DType::kF32, 4096);
        WorkPtr w = g.all_reduce_async(buf.buf());
        throw Error("boom", ExitCode::kBadInput);
      }
      while (!freed.load()) std::this_thread::yield();
      g.all_reduce(a.buf());
      peer_completed.store(true);
    });
    FAIL() << "expected the failure";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "[rank 0] boom");
    EXPECT_EQ(e.exit_code(), 2);
  }
  EXPECT_FALSE(peer_completed.load());
}

TEST(Local, BadArgumentsAreRefusedBeforeAnyWork) {
  run_local(2, [](Group& g) {
    Host a(DType::kF32, 10), b(DType::kF32, 15);  // 10: divisible by 2 ranks
    EXPECT_THROW(g.all_gather(a.buf(), b.buf()), Error);
    EXPECT_THROW(g.all_reduce(a.buf(), b.buf()), Error);
    EXPECT_THROW(g.send(a.buf(), 2), Error);
    Host c(DType::kBF16, 10);
    EXPECT_THROW(g.all_reduce(a.buf(), c.buf()), Error);
    EXPECT_THROW(g.all_to_all(a.buf(), a.buf()), Error);
    // i32 (token ids) is moved, never reduced: the backends would read it as bf16.
    Host i(DType::kI32, 10), j(DType::kI32, 5), k(DType::kI32, 20);
    try {
      g.all_reduce(i.buf());
      ADD_FAILURE() << "an i32 all_reduce was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("reductions take f32 or bf16"), std::string::npos)
          << e.what();
      EXPECT_EQ(e.exit_code(), 2);
    }
    EXPECT_THROW(g.reduce_scatter(i.buf(), j.buf()), Error);
    g.all_gather(i.buf(), k.buf());  // moving i32 is fine
    g.barrier();
  });
}

}  // namespace
}  // namespace mt::comm

namespace mt::comm {
namespace {

// A waiting rank spins (instead of sleeping at once) only where every rank thread of the job
// has a core of its own; where rank threads outnumber the cores, spinning would take a core
// from a rank with work.
TEST(Local, WaitingRanksSpinOnlyWhereEveryRankHasACore) {
  const int cores = process_cores();
  LaunchOptions o;
  o.world_size = cores;
  EXPECT_EQ(local_spin_seconds(o), 0) << "threads_per_rank not given: no spin";
  o.threads_per_rank = 1;
  EXPECT_GT(local_spin_seconds(o), 0) << o.world_size << " ranks x 1 thread on " << cores;
  o.world_size = cores + 1;
  EXPECT_EQ(local_spin_seconds(o), 0) << o.world_size << " ranks x 1 thread on " << cores;
  o.world_size = 1;
  o.threads_per_rank = cores + 1;
  EXPECT_EQ(local_spin_seconds(o), 0) << "1 rank x " << o.threads_per_rank << " threads";
}

TEST(Local, EachRankThreadInstallsItsOwnTracker) {
  std::vector<mem::Tracker> trackers(3);
  LaunchOptions o;
  o.backend = BackendKind::kLocal;
  o.world_size = 3;
  o.rank_trackers = {&trackers[0], &trackers[1], &trackers[2]};
  launch(o, [](Group& g) {
    Tensor t = Tensor::empty({(g.rank() + 1) * 100}, DType::kF32, mem::Category::kActivations);
    g.barrier();
    EXPECT_EQ(mem::current_tracker().snapshot().of(mem::Category::kActivations),
              (g.rank() + 1) * 400);
  });
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(trackers[r].snapshot().peak_of(mem::Category::kActivations), (r + 1) * 400);
}

}  // namespace
}  // namespace mt::comm

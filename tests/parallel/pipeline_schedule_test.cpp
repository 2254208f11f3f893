// The pipeline schedule IR: bubble fractions and peak microbatches in flight against the
// formulas (docs/pipeline.md), the verifier on every (pp, microbatches, v) in a range and on
// hand-corrupted schedules, partitioning, and the refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "core/error.h"
#include "parallel/pipeline/partition.h"
#include "parallel/pipeline/replay.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/verify.h"

namespace mt::parallel::pp {
namespace {

using K = ScheduleKind;
using A = ActionKind;

// Unit costs: F = 1, B = 2 (I = W = 1). Every value below is a small integer or a ratio of
// them, so equality is exact in double.
Timeline unit_replay(const Schedule& s) { return replay(s, unit_costs()); }

TEST(PipelineSchedule, GPipeAnd1F1BBubbleIsExactlyTheFormula) {
  // (p − 1)/(m + p − 1) of the makespan: Huang et al. 2019 §2.2; Narayanan et al. SC'21 §2.2.
  for (K kind : {K::kGPipe, K::k1F1B})
    for (int p = 1; p <= 8; ++p)
      for (int m = p; m <= 4 * p; ++m) {
        const Schedule s = build_schedule(kind, p, m);
        const Timeline t = unit_replay(s);
        EXPECT_EQ(t.makespan, 3.0 * (m + p - 1))
            << schedule_kind_name(kind) << " p " << p << " m " << m;
        EXPECT_DOUBLE_EQ(t.bubble_fraction(), double(p - 1) / (m + p - 1));
        for (int r = 0; r < p; ++r) EXPECT_EQ(t.idle[r], 3.0 * (p - 1));
      }
}

TEST(PipelineSchedule, InterleavedBubbleIsOneVthOf1F1B) {
  // Narayanan et al. SC'21 §2.2.2: bubble time (p − 1)(tf + tb)/v with tf, tb per stage, so
  // with F = 1, B = 2 per chunk: idle 3(p − 1) per rank against 3·v·m of work, a fraction
  // (p − 1)/(v·m + p − 1). Also where p does not divide m (groups of more than p
  // microbatches, build_schedule).
  for (int p = 2; p <= 6; ++p)
    for (int v = 2; v <= 4; ++v)
      for (int m = p; m <= 4 * p; ++m) {
        const Schedule s = build_schedule(K::kInterleaved1F1B, p, m, v);
        const Timeline t = unit_replay(s);
        EXPECT_EQ(t.makespan, 3.0 * (v * m + p - 1)) << "p " << p << " v " << v << " m " << m;
        EXPECT_DOUBLE_EQ(t.bubble_fraction(), double(p - 1) / (v * m + p - 1));
        // The same model on 1F1B (one chunk of v times the work: F = v, B = 2v) idles v
        // times longer: exactly 1/v of the bubble time.
        const Timeline one = replay(build_schedule(K::k1F1B, p, m), unit_costs(v, 2 * v));
        for (int r = 0; r < p; ++r) {
          EXPECT_EQ(t.idle[r], 3.0 * (p - 1));
          EXPECT_EQ(t.idle[r] * v, one.idle[r]);
        }
      }
}

TEST(PipelineSchedule, ZbH1BubbleIsAThirdOf1F1BAndBelowIt) {
  // Qi et al. ICLR'24 §3.1: ZB-H1's bubble is (p − 1)(TF + TB − TW) = (p − 1) per rank with
  // F = I = W = 1, against 1F1B's (p − 1)(TF + TB + TW) = 3(p − 1).
  for (int p = 2; p <= 8; ++p)
    for (int m = p; m <= 4 * p; ++m) {
      const Timeline zb = unit_replay(build_schedule(K::kZbH1, p, m));
      const Timeline one = unit_replay(build_schedule(K::k1F1B, p, m));
      EXPECT_EQ(zb.makespan, 3.0 * m + p - 1) << "p " << p << " m " << m;
      EXPECT_DOUBLE_EQ(zb.bubble_fraction(), double(p - 1) / (3 * m + p - 1));
      EXPECT_LT(zb.bubble_fraction(), one.bubble_fraction());
    }
}

TEST(PipelineSchedule, PeakMicrobatchesInFlight) {
  for (int p = 1; p <= 8; ++p)
    for (int m = p; m <= 4 * p; ++m) {
      const auto gpipe = peak_in_flight(build_schedule(K::kGPipe, p, m));
      const auto one = peak_in_flight(build_schedule(K::k1F1B, p, m));
      const auto zb = peak_in_flight(build_schedule(K::kZbH1, p, m));
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(gpipe[r], m);    // every microbatch before the first backward
        EXPECT_EQ(one[r], p - r);  // PipeDream-Flush: p − rank
        EXPECT_EQ(zb[r], p);       // ZB-H1: 1F1B's peak (its first rank's) on every rank
      }
      EXPECT_EQ(*std::max_element(zb.begin(), zb.end()), *std::max_element(one.begin(), one.end()));
      if (p < 2) continue;
      // The first group's size: p when p divides m, else ceil(m / floor(m / p)).
      const int groups = m / p, n = (m + groups - 1) / groups;
      for (int v = 2; v <= 4; ++v) {
        // Megatron-LM: warm-up (p − r − 1)·2 + (v − 1)·N chunk-microbatches, plus the one of
        // the first steady step (capped at all v·m).
        const auto inter = peak_in_flight(build_schedule(K::kInterleaved1F1B, p, m, v));
        for (int r = 0; r < p; ++r)
          EXPECT_EQ(inter[r], std::min((p - r - 1) * 2 + (v - 1) * n + 1, v * m))
              << "p " << p << " m " << m << " v " << v << " rank " << r;
      }
    }
}

TEST(PipelineSchedule, EveryScheduleInARangeVerifies) {
  int n = 0;
  for (int p = 1; p <= 8; ++p)
    for (int m = p; m <= 3 * p + 2; ++m) {
      for (K kind : {K::kGPipe, K::k1F1B, K::kZbH1}) {
        EXPECT_EQ(verify(build_schedule(kind, p, m)), "") << schedule_kind_name(kind) << p << m;
        ++n;
      }
      for (int v = 1; v <= 4; ++v) {  // any m: the last group of pp microbatches the rest
        EXPECT_EQ(verify(build_schedule(K::kInterleaved1F1B, p, m, v)), "") << p << m << v;
        ++n;
      }
    }
  EXPECT_GT(n, 640);
}

TEST(PipelineSchedule, FewerMicrobatchesThanStagesIsRefusedClearly) {
  for (K kind : {K::kGPipe, K::k1F1B, K::kInterleaved1F1B, K::kZbH1}) {
    try {
      build_schedule(kind, 4, 3, kind == K::kInterleaved1F1B ? 2 : 1);
      FAIL() << "accepted m < p";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ExitCode::kBadInput);
      EXPECT_NE(std::string(e.what()).find("--microbatches 3 is fewer than --pp 4"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(build_schedule(K::k1F1B, 2, 4, 2), Error);  // v > 1 needs interleaved
}

// Finds the index of an action on a rank.
size_t find(const Schedule& s, int r, A kind, int mb, int chunk) {
  const auto& l = s.ranks[r];
  for (size_t i = 0; i < l.size(); ++i)
    if (l[i].kind == kind && l[i].microbatch == mb && l[i].chunk == chunk) return i;
  ADD_FAILURE() << "no such action";
  return 0;
}

TEST(PipelineSchedule, CorruptedSchedulesAreRejected) {
  const Schedule good = build_schedule(K::k1F1B, 2, 4);
  ASSERT_EQ(verify(good), "");
  {  // a receive moved before the send it depends on: both ranks wait forever
    Schedule s = good;
    auto& l = s.ranks[0];
    const size_t rg = find(s, 0, A::kRecvGrad, 0, 0);
    const Action a = l[rg];
    l.erase(l.begin() + static_cast<long>(rg));
    l.insert(l.begin(), a);
    const std::string err = verify(s);
    EXPECT_NE(err.find("deadlock"), std::string::npos) << err;
    EXPECT_NE(err.find("rank 0 waits"), std::string::npos) << err;
    EXPECT_THROW(verify_or_throw(s), Error);
  }
  {  // a forward dropped
    Schedule s = good;
    s.ranks[1].erase(s.ranks[1].begin() + static_cast<long>(find(s, 1, A::kForward, 2, 1)));
    EXPECT_NE(verify(s).find("no forward"), std::string::npos) << verify(s);
  }
  {  // a backward repeated
    Schedule s = good;
    s.ranks[1].push_back(s.ranks[1][find(s, 1, A::kBackward, 3, 1)]);
    EXPECT_NE(verify(s).find("repeated"), std::string::npos) << verify(s);
  }
  {  // wrong peer
    Schedule s = good;
    s.ranks[0][find(s, 0, A::kSendAct, 1, 0)].peer = 0;
    EXPECT_NE(verify(s).find("peer"), std::string::npos) << verify(s);
  }
  {  // a backward before its forward
    Schedule s = good;
    auto& l = s.ranks[1];
    std::swap(l[find(s, 1, A::kForward, 0, 1)], l[find(s, 1, A::kBackward, 0, 1)]);
    EXPECT_NE(verify(s), "");
  }
  {  // microbatches swapped in one rank's receives: the forward of 1 would read 0's input
    Schedule s = good;
    auto& l = s.ranks[1];
    std::swap(l[find(s, 1, A::kForward, 0, 1)], l[find(s, 1, A::kForward, 1, 1)]);
    EXPECT_NE(verify(s), "");
  }
  {  // W before its I in ZB-H1
    Schedule s = build_schedule(K::kZbH1, 2, 4);
    auto& l = s.ranks[0];
    std::swap(l[find(s, 0, A::kBackwardInput, 2, 0)], l[find(s, 0, A::kBackwardWeight, 2, 0)]);
    EXPECT_NE(verify(s).find("backward-weight before"), std::string::npos) << verify(s);
  }
  {  // a chunk on the wrong rank
    Schedule s = build_schedule(K::kInterleaved1F1B, 2, 4, 2);
    s.ranks[0][0].chunk = 1;
    EXPECT_NE(verify(s).find("lives on rank"), std::string::npos) << verify(s);
  }
}

TEST(PipelineSchedule, ReplayWithTransferTimeAndGrid) {
  // A send that takes c delays every receive by c: GPipe's makespan grows by 2(p − 1)·c
  // (the forward fill and the backward drain each cross p − 1 links), and the replay of the
  // same lists with other costs stays valid (what the planner relies on).
  const Schedule g = build_schedule(K::kGPipe, 4, 8);
  EXPECT_DOUBLE_EQ(replay(g, unit_costs(1, 2, 1, 1, 0.5)).makespan, 3.0 * (8 + 3) + 3.0);
  const Schedule s = build_schedule(K::k1F1B, 4, 8);
  EXPECT_GT(replay(s, unit_costs(1, 2, 1, 1, 0.5)).makespan, 3.0 * (8 + 3) + 3.0);
  const std::string grid = format_grid(s);
  EXPECT_NE(grid.find("rank 3"), std::string::npos);
  EXPECT_NE(grid.find("F0.0"), std::string::npos);
  EXPECT_NE(format_grid(s, true).find("sa0.0>1"), std::string::npos);
}

// The interval of rank r's action `kind`(mb, chunk) in a timeline.
Interval interval_of(const Schedule& s, const Timeline& t, int r, A kind, int mb, int chunk) {
  for (const Interval& iv : t.ranks[r]) {
    const Action& a = s.ranks[r][iv.action];
    if (a.kind == kind && a.microbatch == mb && a.chunk == chunk) return iv;
  }
  ADD_FAILURE() << "no such action";
  return {};
}

TEST(PipelineRendezvous, ASendWaitsForItsReceive) {
  // GPipe over 2 ranks, 3 microbatches, free transfers; rank 1's forward takes 3. Rank 1
  // posts the receive of microbatch 1 only after its forward of microbatch 0 (1..4), so on
  // NCCL rank 0's send of it (issued at 2) waits until 4; asynchronously it is gone at 2.
  const Schedule s = build_schedule(K::kGPipe, 2, 3);
  const CostFn cost = [](int r, const Action& a) {
    if (a.kind == A::kForward) return r == 1 ? 3.0 : 1.0;
    return a.kind == A::kBackward ? 2.0 : 0.0;
  };
  const Interval rdv = interval_of(s, replay_rendezvous(s, cost), 0, A::kSendAct, 1, 0);
  EXPECT_DOUBLE_EQ(rdv.start, 2.0);
  EXPECT_DOUBLE_EQ(rdv.end, 4.0);
  EXPECT_DOUBLE_EQ(interval_of(s, replay(s, cost), 0, A::kSendAct, 1, 0).end, 2.0);
}

TEST(PipelineRendezvous, ABatchsMessagesShareTheRanksLink) {
  // Rank 0 runs both forwards, then sends both outputs in one batch; rank 1 receives both in
  // one. Transfers take 0.5 each: the batch moves at 2 (when rank 0 posts it) and takes 1.0
  // (two messages one after another on each side's link); rank 1 then computes 3..5.
  // Asynchronously each message is a separate 0.5 from 2: rank 1 computes 2.5..4.5.
  std::vector<std::vector<std::vector<Action>>> steps = {
      {{{A::kForward, 0, 0}, {A::kForward, 1, 0}}}, {{{A::kForward, 0, 1}, {A::kForward, 1, 1}}}};
  const Schedule s = lower_communication(K::kGPipe, 2, 2, 1, Lowering::kBatched, steps);
  ASSERT_EQ(s.ranks[0][2], (Action{A::kSendAct, 0, 0, 1}));
  ASSERT_EQ(s.ranks[0][3], (Action{A::kSendAct, 1, 0, 1}));
  ASSERT_EQ(s.ranks[1][1], (Action{A::kRecvAct, 1, 1, 0}));
  const CostFn cost = unit_costs(1, 2, 1, 1, 0.5);
  const Timeline rdv = replay_rendezvous(s, cost);
  EXPECT_DOUBLE_EQ(interval_of(s, rdv, 1, A::kRecvAct, 1, 1).end, 3.0);
  EXPECT_DOUBLE_EQ(interval_of(s, rdv, 0, A::kSendAct, 0, 0).end, 3.0);
  EXPECT_DOUBLE_EQ(rdv.makespan, 5.0);
  EXPECT_DOUBLE_EQ(replay(s, cost).makespan, 4.5);
}

TEST(PipelineRendezvous, BatchedInterleavingExchangesAsMegatronLm) {
  // pp 2, v 2, 4 microbatches, rank 0 (chunks 0 and 2): in the steady state the step
  // F3.0 + B1.2 is followed by one exchange with both neighbours (rank 1 either side):
  // Megatron-LM's send_forward_backward_recv_forward_backward — the forward's output and the
  // backward's input gradient go out, the next forward's input and the next backward's
  // output gradient come in.
  const Schedule s = build_schedule(K::kInterleaved1F1B, 2, 4, 2, Lowering::kBatched);
  EXPECT_EQ(s.lowering, Lowering::kBatched);
  const auto& l = s.ranks[0];
  const size_t b = size_t(find(s, 0, A::kBackward, 1, 2));
  ASSERT_LT(b + 5, l.size());
  EXPECT_EQ(l[b - 1], (Action{A::kForward, 3, 0, -1}));
  EXPECT_EQ(l[b + 1], (Action{A::kSendAct, 3, 0, 1}));
  EXPECT_EQ(l[b + 2], (Action{A::kSendGrad, 1, 2, 1}));
  EXPECT_EQ(l[b + 3], (Action{A::kRecvAct, 2, 2, 1}));
  EXPECT_EQ(l[b + 4], (Action{A::kRecvGrad, 0, 0, 1}));
  EXPECT_TRUE(l[b + 5].is_compute());
  // NCCL matches a pair's messages in issue order: the two sends swapped, rank 1 would take
  // the gradient for the activation. The verifier refuses it (the async lists do not care).
  Schedule swapped = s;
  std::swap(swapped.ranks[0][b + 1], swapped.ranks[0][b + 2]);
  EXPECT_NE(verify(swapped).find("sends to rank 1 in another order"), std::string::npos)
      << verify(swapped);
  swapped.lowering = Lowering::kPerAction;
  EXPECT_EQ(verify(swapped), "");
}

TEST(PipelineRendezvous, BatchedExchangesNeverHangPerActionInterleavingDoes) {
  int per_action_hangs = 0, n = 0;
  for (int p = 2; p <= 8; ++p)
    for (int m = p; m <= 4 * p; ++m) {
      // GPipe and 1F1B: a step is one action, so both lowerings are the same lists (ZB-H1:
      // BatchedZbH1KeepsItsBubble).
      for (K kind : {K::kGPipe, K::k1F1B}) {
        const Schedule batched = build_schedule(kind, p, m, 1, Lowering::kBatched);
        EXPECT_EQ(batched.ranks, build_schedule(kind, p, m).ranks);
        EXPECT_EQ(verify(batched), "") << schedule_kind_name(kind) << " p " << p << " m " << m;
        ++n;
      }
      if (m % p != 0) {  // the batched lowering needs pp to divide m; per action takes any
        EXPECT_THROW(build_schedule(K::kInterleaved1F1B, p, m, 2, Lowering::kBatched), Error);
        continue;
      }
      for (int v = 1; v <= 4; ++v) {
        SCOPED_TRACE(testing::Message() << "interleaved p " << p << " v " << v << " m " << m);
        const Schedule per_action = build_schedule(K::kInterleaved1F1B, p, m, v);
        const Schedule batched = build_schedule(K::kInterleaved1F1B, p, m, v, Lowering::kBatched);
        // The same compute order; only the exchanges are grouped.
        for (int r = 0; r < p; ++r) {
          std::vector<Action> a, b;
          std::copy_if(per_action.ranks[r].begin(), per_action.ranks[r].end(),
                       std::back_inserter(a), [](const Action& x) { return x.is_compute(); });
          std::copy_if(batched.ranks[r].begin(), batched.ranks[r].end(), std::back_inserter(b),
                       [](const Action& x) { return x.is_compute(); });
          EXPECT_EQ(a, b);
        }
        EXPECT_EQ(verify(batched), "");  // includes the rendezvous replay
        // With free transfers, lock-step exchanges keep the interleaved bubble's formula.
        EXPECT_EQ(replay_rendezvous(batched, unit_costs()).makespan, 3.0 * (v * m + p - 1));
        try {
          replay_rendezvous(per_action, unit_costs());
        } catch (const Error&) {
          ++per_action_hangs;
        }
        ++n;
      }
    }
  EXPECT_GT(n, 330);
  EXPECT_GT(per_action_hangs, 0);
  EXPECT_THROW(replay_rendezvous(build_schedule(K::kInterleaved1F1B, 2, 4, 2), unit_costs()),
               Error);
}

// The compute actions of a rank's list, in order.
std::vector<Action> compute_of(const std::vector<Action>& list) {
  std::vector<Action> out;
  std::copy_if(list.begin(), list.end(), std::back_inserter(out),
               [](const Action& x) { return x.is_compute(); });
  return out;
}

TEST(PipelineRendezvous, BatchedZbH1KeepsItsBubble) {
  // ZB-H1's W between a backward-input and the next forward used to split 1F1B's
  // send_backward_recv_forward in two ({sg} W {ra}): the neighbour's {sa, rg} needed both
  // and waited for this rank's W every cycle. Lock-step, ZB-H1 was then slower than 1F1B
  // from m = 2p on (pp 8, m 32: 133 against 117; asynchronously 103). Its batched lowering
  // now meets each message where the asynchronous replay has it: with unit costs it keeps
  // the asynchronous makespan 3m + p − 1 (Qi et al. §3.1), never more than 1F1B's lock-step.
  for (int p = 2; p <= 8; ++p)
    for (int m = p; m <= 8 * p; ++m) {
      SCOPED_TRACE(testing::Message() << "zb1 p " << p << " m " << m);
      const Schedule per_action = build_schedule(K::kZbH1, p, m);
      const Schedule batched = build_schedule(K::kZbH1, p, m, 1, Lowering::kBatched);
      EXPECT_EQ(batched.lowering, Lowering::kBatched);
      for (int r = 0; r < p; ++r)  // the same compute order: only the exchanges move
        ASSERT_EQ(compute_of(per_action.ranks[r]), compute_of(batched.ranks[r]));
      ASSERT_EQ(verify(batched), "");  // matched in order, and no hang under rendezvous
      // A send reads its microbatch's buffer: never after the W that gives it back.
      for (int r = 0; r < p; ++r)
        for (const Action& a : batched.ranks[r]) {
          if (!a.is_send()) continue;
          EXPECT_LT(find(batched, r, a.kind, a.microbatch, r),
                    find(batched, r, A::kBackwardWeight, a.microbatch, r));
        }
      const double rdv = replay_rendezvous(batched, unit_costs()).makespan;
      EXPECT_EQ(rdv, 3.0 * m + p - 1);
      EXPECT_EQ(unit_replay(batched).makespan, 3.0 * m + p - 1);
      EXPECT_LE(rdv, replay_rendezvous(build_schedule(K::k1F1B, p, m, 1, Lowering::kBatched),
                                       unit_costs())
                         .makespan);
    }
  // The review's case: pp 8, m 32.
  const Schedule zb = build_schedule(K::kZbH1, 8, 32, 1, Lowering::kBatched);
  const Schedule one = build_schedule(K::k1F1B, 8, 32, 1, Lowering::kBatched);
  EXPECT_EQ(replay_rendezvous(zb, unit_costs()).makespan, 103.0);
  EXPECT_EQ(replay_rendezvous(one, unit_costs()).makespan, 117.0);
  // Costs other than the unit ones the lowering was timed with (I 1.2, W 0.8): still the
  // asynchronous makespan; I 0.9, W 1.3: within 2% of it, and below 1F1B's.
  const CostFn heavy_i = unit_costs(1, 2, 1.2, 0.8), heavy_w = unit_costs(1, 2, 0.9, 1.3);
  EXPECT_DOUBLE_EQ(replay_rendezvous(zb, heavy_i).makespan,
                   replay(build_schedule(K::kZbH1, 8, 32), heavy_i).makespan);
  const double w_rdv = replay_rendezvous(zb, heavy_w).makespan;
  EXPECT_LE(w_rdv, 1.02 * replay(build_schedule(K::kZbH1, 8, 32), heavy_w).makespan);
  EXPECT_LT(w_rdv, replay_rendezvous(one, heavy_w).makespan);
}

TEST(PipelineRendezvous, BatchedZbH1PairsExchangesAs1F1B) {
  // pp 4, m 8, rank 1 in the steady state: 1F1B's two paired exchanges, with the deferred W
  // before send_backward_recv_forward instead of inside it:
  //   I2 W1 {sg2>0, ra5<0} F5 {sa5>2, rg3<2} I3
  const Schedule s = build_schedule(K::kZbH1, 4, 8, 1, Lowering::kBatched);
  const auto& l = s.ranks[1];
  const size_t i = find(s, 1, A::kBackwardInput, 2, 1);
  ASSERT_LT(i + 7, l.size());
  EXPECT_EQ(l[i + 1], (Action{A::kBackwardWeight, 1, 1, -1}));
  EXPECT_EQ(l[i + 2], (Action{A::kSendGrad, 2, 1, 0}));
  EXPECT_EQ(l[i + 3], (Action{A::kRecvAct, 5, 1, 0}));
  EXPECT_EQ(l[i + 4], (Action{A::kForward, 5, 1, -1}));
  EXPECT_EQ(l[i + 5], (Action{A::kSendAct, 5, 1, 2}));
  EXPECT_EQ(l[i + 6], (Action{A::kRecvGrad, 3, 1, 2}));
  EXPECT_EQ(l[i + 7], (Action{A::kBackwardInput, 3, 1, -1}));
  // The per-action lists have the W between the two halves of the first exchange.
  const Schedule pa = build_schedule(K::kZbH1, 4, 8);
  const size_t j = find(pa, 1, A::kBackwardInput, 2, 1);
  EXPECT_EQ(pa.ranks[1][j + 1], (Action{A::kSendGrad, 2, 1, 0}));
  EXPECT_EQ(pa.ranks[1][j + 2], (Action{A::kBackwardWeight, 1, 1, -1}));
  EXPECT_EQ(pa.ranks[1][j + 3], (Action{A::kRecvAct, 5, 1, 0}));
}

TEST(PipelinePartition, BalancedCountsTheEmbeddingAndTheHead) {
  const std::vector<double> layers(8, 1.0);
  EXPECT_EQ(balanced_partition(layers, 0, 0, 4).layers, (std::vector<int>{2, 2, 2, 2}));
  // A heavy head (2 layers' worth) pushes layers off the last stage.
  const Partition p = balanced_partition(layers, 0.5, 2.0, 4);
  // Costs 0.5 + 2, 2, 3, 1 + 2: the best largest chunk is 3 (an even 2,2,2,2 gives 4).
  EXPECT_EQ(p.layers, (std::vector<int>{2, 2, 3, 1}));
  EXPECT_EQ(p.first, (std::vector<int>{0, 2, 4, 7, 8}));
  EXPECT_DOUBLE_EQ(*std::max_element(p.cost.begin(), p.cost.end()), 3.0);
  EXPECT_THROW(balanced_partition(layers, 0, 0, 9), Error);
}

// The full O(chunks · L²) scan balanced_partition used to run, as the reference of its
// faster one (layer counts per chunk).
std::vector<int> full_scan_partition(const std::vector<double>& cost, double first_extra,
                                     double last_extra, int chunks) {
  const int L = static_cast<int>(cost.size());
  std::vector<double> prefix(L + 1, 0);
  for (int l = 0; l < L; ++l) prefix[l + 1] = prefix[l] + cost[l];
  auto range = [&](int c, int lo, int hi) {
    return prefix[hi] - prefix[lo] + (c == 0 ? first_extra : 0) +
           (c == chunks - 1 ? last_extra : 0);
  };
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(chunks, std::vector<double>(L + 1, kInf));
  std::vector<std::vector<int>> cut(chunks, std::vector<int>(L + 1, -1));
  for (int l = 1; l <= L; ++l) best[0][l] = range(0, 0, l);
  for (int c = 1; c < chunks; ++c)
    for (int l = c + 1; l <= L; ++l)
      for (int k = c; k < l; ++k) {
        const double v = std::max(best[c - 1][k], range(c, k, l));
        if (v < best[c][l] - 1e-12) best[c][l] = v, cut[c][l] = k;
      }
  std::vector<int> layers(chunks);
  int hi = L;
  for (int c = chunks - 1; c > 0; --c) layers[c] = hi - cut[c][hi], hi = cut[c][hi];
  layers[0] = hi;
  return layers;
}

TEST(PipelinePartition, BalancedSplitIsTheFullScans) {
  // balanced_partition starts each cut's scan at the crossing and stops past the best (the
  // planner splits thousands of layers): the same cuts as the full scan, ties included
  // (equal layers), on GPT costs and on uneven ones.
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(1.0, 100.0);
  for (int trial = 0; trial < 400; ++trial) {
    const int L = 1 + trial % 40;
    std::vector<double> cost(static_cast<size_t>(L), 24.0 * 768 * 768 + 4.0 * 1024 * 768);
    if (trial % 4 == 1)
      for (double& x : cost) x = u(rng);
    if (trial % 4 == 2)  // ties galore, every layer dear enough for the fast path
      for (double& x : cost) x = 1 + std::round(u(rng) / 20);
    if (trial % 4 == 3)  // mixed magnitudes, some layers below the sums' rounding
      for (double& x : cost) x = u(rng) < 30 ? 1e-8 : u(rng) < 60 ? 1.0 : 1e9;
    const double first = trial % 2 ? u(rng) : 0.0, last = trial % 5 ? u(rng) * 30 : 0.0;
    for (int chunks = 1; chunks <= L; ++chunks)
      ASSERT_EQ(balanced_partition(cost, first, last, chunks).layers,
                full_scan_partition(cost, first, last, chunks))
          << "L " << L << " chunks " << chunks << " trial " << trial;
  }
  // The review's case: 1e-8 layers among 1e9 ones with large extras.
  const std::vector<double> mixed = {4e9, 1e-8, 1e-8, 1e9, 1e-8, 4e9};
  EXPECT_EQ(balanced_partition(mixed, 43452.1, 37837.6, 2).layers,
            full_scan_partition(mixed, 43452.1, 37837.6, 2));
  const auto gpt = gpt_chunk_costs(500, 768, 1024, 50304);
  for (int chunks : {2, 3, 7, 16, 64, 128})
    EXPECT_EQ(balanced_partition(gpt.layer, gpt.first_extra, gpt.last_extra, chunks).layers,
              full_scan_partition(gpt.layer, gpt.first_extra, gpt.last_extra, chunks))
        << chunks;
}

TEST(PipelinePartition, ExplicitSplitMustCoverEveryLayerOnce) {
  const std::vector<double> layers(24, 1.0);
  EXPECT_EQ(explicit_partition(parse_layer_counts("5,7,7,5"), layers, 0, 0, 4).first,
            (std::vector<int>{0, 5, 12, 19, 24}));
  auto message = [&](const std::string& text, int chunks) {
    try {
      explicit_partition(parse_layer_counts(text), layers, 0, 0, chunks);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ExitCode::kBadInput);
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message("5,7,7,3", 4).find("2 layer(s) would be dropped"), std::string::npos);
  EXPECT_NE(message("5,7,7,7", 4).find("repeated"), std::string::npos);
  EXPECT_NE(message("12,12", 4).find("has 2 entries"), std::string::npos);
  EXPECT_NE(message("24,0,0,0", 4).find("chunk 1 has 0 layers"), std::string::npos);
  EXPECT_NE(message("12,0,12,0", 4).find("chunk 1 has 0 layers"), std::string::npos);
  EXPECT_NE(message("0", 1).find("chunk 0 has 0 layers"), std::string::npos);  // no pipeline
  // The first and the last chunk may hold the embedding or the LM head alone.
  EXPECT_EQ(explicit_partition(parse_layer_counts("0,12,12,0"), layers, 1, 2, 4).first,
            (std::vector<int>{0, 0, 12, 24, 24}));
  EXPECT_EQ(explicit_partition(parse_layer_counts("0,12,12,0"), layers, 1, 2, 4).cost,
            (std::vector<double>{1, 12, 12, 2}));
  EXPECT_THROW(parse_layer_counts("5,x"), Error);
  EXPECT_THROW(parse_layer_counts(""), Error);
}

}  // namespace
}  // namespace mt::parallel::pp

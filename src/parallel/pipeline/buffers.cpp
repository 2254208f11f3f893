#include "parallel/pipeline/buffers.h"

#include <algorithm>
#include <cstdint>

#include "core/error.h"
#include "parallel/pipeline/exec_order.h"

namespace mt::parallel::pp {

namespace {

// A buffer of one rank while the step is walked.
struct Buffer {
  bool held = false;
  int64_t freed_at = -1;   // when the walk freed it (-1: never taken)
  int pending_sends = 0;   // sends of its (microbatch, chunk) not yet posted
  std::vector<int> sends;  // message tags of the posted ones
};

}  // namespace

BufferPlan plan_buffers(const Schedule& s) {
  const int P = s.pp, C = s.num_chunks(), M = s.microbatches;
  const size_t pairs = static_cast<size_t>(M) * static_cast<size_t>(C);
  std::vector<std::vector<ExecStep>> order(static_cast<size_t>(P));
  for (int r = 0; r < P; ++r) order[size_t(r)] = execution_order(s.ranks[size_t(r)]);

  BufferPlan plan;
  plan.num_chunks = C;
  plan.buffers.assign(size_t(P), 0);
  plan.slots.assign(size_t(P), std::vector<int>(pairs, -1));
  // Each rank starts with the schedule's peak in flight plus one: the executor posts a
  // receive before a freed buffer's send has finished (and the walk adds where it must).
  std::vector<std::vector<Buffer>> bufs(static_cast<size_t>(P));
  const std::vector<int> peak = peak_in_flight(s);
  for (int r = 0; r < P; ++r) bufs[size_t(r)].resize(size_t(peak[size_t(r)] + (P > 1 ? 1 : 0)));
  int64_t clock = 0;  // steps walked, over all ranks
  // Sends each (microbatch, chunk) of a rank makes from its buffer.
  std::vector<std::vector<int>> sends_of(size_t(P), std::vector<int>(pairs, 0));
  for (int r = 0; r < P; ++r)
    for (const Action& a : s.ranks[size_t(r)])
      if (a.is_send()) ++sends_of[size_t(r)][size_t(a.microbatch) * size_t(C) + size_t(a.chunk)];

  // Per message (its tag): sent (posted by the sender), and its receive issued: NCCL issues a
  // rank's posted operations as one group when the rank reaches its next wait; MPI and the
  // local backend match a receive when it is posted, earlier, so this is the later of the two.
  const size_t tags = 2 * pairs;
  std::vector<char> sent(tags, 0), issued(tags, 0);
  std::vector<std::vector<int>> posted(static_cast<size_t>(P));  // posted, not yet issued

  // The buffer rank r takes now: of those free, with their sends all posted and the
  // receives issued, the one freed longest ago (its sends have had the most time to finish
  // when the run's timing differs from the walk's). -1 if none.
  auto reusable = [&](int r) {
    const std::vector<Buffer>& b = bufs[size_t(r)];
    int best = -1;
    for (size_t i = 0; i < b.size(); ++i) {
      if (b[i].held || b[i].pending_sends > 0) continue;
      if (!std::all_of(b[i].sends.begin(), b[i].sends.end(),
                       [&](int tag) { return issued[size_t(tag)] != 0; }))
        continue;
      if (best < 0 || b[i].freed_at < b[size_t(best)].freed_at) best = static_cast<int>(i);
    }
    return best;
  };
  auto take = [&](int r, int mb, int chunk, int slot) {
    const size_t key = size_t(mb) * size_t(C) + size_t(chunk);
    std::vector<Buffer>& b = bufs[size_t(r)];
    if (slot < 0) {
      slot = static_cast<int>(b.size());
      b.emplace_back();
    }
    plan.slots[size_t(r)][key] = slot;
    Buffer& buf = b[size_t(slot)];
    buf.held = true;
    buf.sends.clear();
    buf.pending_sends = sends_of[size_t(r)][key];
  };
  auto buffer_of = [&](int r, const Action& a) -> Buffer& {
    const int slot = plan.slot_of(r, a.microbatch, a.chunk);
    MT_ASSERT(slot >= 0);
    return bufs[size_t(r)][size_t(slot)];
  };
  // The (microbatch, chunk) a step takes a buffer for, if it takes one.
  auto takes = [&](int r, const ExecStep& e, const Action& a) {
    if (e.kind == ExecStepKind::kPostRecv) return a.kind == ActionKind::kRecvAct;
    return e.kind == ExecStepKind::kCompute && a.kind == ActionKind::kForward &&
           plan.slot_of(r, a.microbatch, a.chunk) < 0;
  };

  // Run the step with every rank as far as it can go: a wait blocks until its message is
  // sent, taking a buffer blocks until one is reusable (the executor waits for the sends of
  // the buffer its plan names; they complete once their receives are issued). Where every
  // unfinished rank is blocked, the first one blocked on a buffer gets a new one. Every wait
  // the plan makes the executor do is then for an event earlier in this walk, so no timing
  // can close a cycle of waits (the schedule's own receives are the verifier's matter).
  std::vector<size_t> next(size_t(P), 0);
  int grow = -1;  // the rank that takes a new buffer at its blocked step
  for (;;) {
    bool progress = false, done = true;
    int starved = -1;  // the first rank blocked on a buffer
    for (int r = 0; r < P; ++r) {
      const std::vector<ExecStep>& steps = order[size_t(r)];
      for (size_t& k = next[size_t(r)]; k < steps.size(); ++k) {
        const ExecStep& e = steps[k];
        const Action& a = s.ranks[size_t(r)][size_t(e.index)];
        const int tag = a.is_compute() ? -1 : message_tag(s, a);
        if (e.kind == ExecStepKind::kWaitRecv) {
          for (int t : posted[size_t(r)]) issued[size_t(t)] = 1;
          posted[size_t(r)].clear();
          if (!sent[size_t(tag)]) break;
        } else if (takes(r, e, a)) {
          const int slot = reusable(r);
          if (slot < 0 && r != grow) {
            if (starved < 0) starved = r;
            break;
          }
          if (slot < 0) grow = -1;
          take(r, a.microbatch, a.chunk, slot);  // -1: a new buffer
        }
        if (e.kind == ExecStepKind::kPostRecv) posted[size_t(r)].push_back(tag);
        if (e.kind == ExecStepKind::kSend) {
          Buffer& b = buffer_of(r, a);
          b.sends.push_back(tag);
          --b.pending_sends;
          sent[size_t(tag)] = 1;
        }
        if (e.kind == ExecStepKind::kCompute &&
            (a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardWeight)) {
          buffer_of(r, a).held = false;
          buffer_of(r, a).freed_at = clock;
        }
        ++clock;
        progress = true;
      }
      if (next[size_t(r)] < steps.size()) done = false;
    }
    if (done) break;
    if (progress) continue;
    if (starved < 0)
      fail(
          "pipeline schedule ({} ranks, {} microbatches, v {}): every rank waits for a "
          "message not yet sent; the lists deadlock (`meshtrain schedule` verifies them)",
          P, M, s.virtual_stages);
    grow = starved;
  }
  for (int r = 0; r < P; ++r) plan.buffers[size_t(r)] = static_cast<int>(bufs[size_t(r)].size());
  return plan;
}

}  // namespace mt::parallel::pp

#include "parallel/pipeline/executor.h"

#include "core/clock.h"
#include "core/error.h"
#include "core/profile.h"

namespace mt::parallel::pp {

Executor::Executor(const Schedule& s, int rank, comm::Group& pp_group)
    : s_(s), rank_(rank), group_(pp_group) {
  MT_ASSERT(pp_group.size() == s.pp && pp_group.rank() == rank);
  events_.reserve(s.ranks[rank].size() * 2);
}

void Executor::run(Stage& stage) {
  const std::vector<Action>& list = s_.ranks[rank_];
  const size_t n = list.size();
  std::vector<comm::WorkPtr> recvs(n), sends(n);
  events_.clear();
  const double t0 = now_s();
  size_t posted = 0;  // receives at indices < posted are posted
  auto post_until = [&](size_t end, bool allow_act) {
    for (; posted < end && posted < n; ++posted) {
      const Action& a = list[posted];
      if (a.kind == ActionKind::kRecvAct && !allow_act) return;
      if (a.is_recv())
        recvs[posted] = group_.recv_async(stage.recv_buffer(a), a.peer, message_tag(s_, a));
    }
  };
  for (size_t i = 0; i < n; ++i) {
    const Action& a = list[i];
    if (a.is_compute()) {
      // Post the receives up to the next compute action before running this one.
      size_t next = i + 1;
      while (next < n && !list[next].is_compute()) ++next;
      if (next < n) ++next;
      const bool frees = a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardWeight;
      post_until(next, !frees);
      const double start = now_s() - t0;
      stage.compute(a);
      events_.push_back({a, start, now_s() - t0, false});
      continue;
    }
    switch (a.kind) {
      case ActionKind::kRecvAct:
      case ActionKind::kRecvGrad: {
        // Every receive of this exchange is posted before the first is waited on: a backend
        // that issues pending operations as one group at a wait (NCCL) then runs the whole
        // exchange as one group, as a batched schedule needs (Lowering::kBatched).
        size_t end = i + 1;
        while (end < n && !list[end].is_compute()) ++end;
        post_until(end, true);
        const double start = now_s() - t0;
        const bool arrived = recvs[i]->test();
        if (!arrived) {
          profile::Scope p("pp.recv_wait");
          recvs[i]->wait();
        }
        recvs[i].reset();
        events_.push_back({a, start, now_s() - t0, !arrived});
        break;
      }
      case ActionKind::kSendAct:
      case ActionKind::kSendGrad: {
        const double start = now_s() - t0;
        sends[i] = group_.send_async(stage.send_buffer(a), a.peer, message_tag(s_, a));
        stage.sent(a, sends[i]);
        events_.push_back({a, start, now_s() - t0, false});
        break;
      }
      default:
        break;
    }
  }
  for (size_t i = 0; i < n; ++i)
    if (sends[i]) sends[i]->wait();
}

}  // namespace mt::parallel::pp

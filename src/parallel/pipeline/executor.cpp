#include "parallel/pipeline/executor.h"

#include "core/clock.h"
#include "core/error.h"
#include "core/profile.h"

namespace mt::parallel::pp {

Executor::Executor(const Schedule& s, int rank, comm::Group& pp_group)
    : s_(s), rank_(rank), group_(pp_group), order_(execution_order(s.ranks[rank])) {
  MT_ASSERT(pp_group.size() == s.pp && pp_group.rank() == rank);
  events_.reserve(s.ranks[rank].size() * 2);
}

void Executor::run(Stage& stage) {
  const std::vector<Action>& list = s_.ranks[rank_];
  const size_t n = list.size();
  std::vector<comm::WorkPtr> recvs(n), sends(n);
  events_.clear();
  const double t0 = now_s();
  for (const ExecStep& step : order_) {
    const size_t i = static_cast<size_t>(step.index);
    const Action& a = list[i];
    switch (step.kind) {
      case ExecStepKind::kPostRecv:
        recvs[i] = group_.recv_async(stage.recv_buffer(a), a.peer, message_tag(s_, a));
        break;
      case ExecStepKind::kCompute: {
        const double start = now_s() - t0;
        stage.compute(a);
        events_.push_back({a, start, now_s() - t0, false});
        break;
      }
      case ExecStepKind::kWaitRecv: {
        // Every receive of this exchange was posted before the first is waited on: a backend
        // that issues pending operations as one group at a wait (NCCL) then runs the whole
        // exchange as one group, as a batched schedule needs (Lowering::kBatched).
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
      case ExecStepKind::kSend: {
        const double start = now_s() - t0;
        sends[i] = group_.send_async(stage.send_buffer(a), a.peer, message_tag(s_, a));
        stage.sent(a, sends[i]);
        events_.push_back({a, start, now_s() - t0, false});
        break;
      }
    }
  }
  for (size_t i = 0; i < n; ++i)
    if (sends[i]) sends[i]->wait();
}

}  // namespace mt::parallel::pp

#include "parallel/pipeline/exec_order.h"

namespace mt::parallel::pp {

std::vector<ExecStep> execution_order(const std::vector<Action>& list) {
  const int n = static_cast<int>(list.size());
  std::vector<ExecStep> order;
  order.reserve(list.size() * 2);
  int posted = 0;  // receives at indices < posted are posted
  auto post_until = [&](int end, bool allow_act) {
    for (; posted < end && posted < n; ++posted) {
      const Action& a = list[static_cast<size_t>(posted)];
      if (a.kind == ActionKind::kRecvAct && !allow_act) return;
      if (a.is_recv()) order.push_back({ExecStepKind::kPostRecv, posted});
    }
  };
  // The index one past the first compute action at or after i (n if none).
  auto past_next_compute = [&](int i) {
    while (i < n && !list[static_cast<size_t>(i)].is_compute()) ++i;
    return i < n ? i + 1 : n;
  };
  for (int i = 0; i < n; ++i) {
    const Action& a = list[static_cast<size_t>(i)];
    if (a.is_compute()) {
      const bool frees = a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardWeight;
      post_until(past_next_compute(i + 1), !frees);
      order.push_back({ExecStepKind::kCompute, i});
    } else if (a.is_recv()) {
      int end = i + 1;  // the exchange: up to the next compute action
      while (end < n && !list[static_cast<size_t>(end)].is_compute()) ++end;
      post_until(end, true);
      order.push_back({ExecStepKind::kWaitRecv, i});
    } else {
      order.push_back({ExecStepKind::kSend, i});
    }
  }
  return order;
}

}  // namespace mt::parallel::pp

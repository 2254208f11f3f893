// The order in which the executor (executor.h) performs one rank's action list: when each
// receive is posted, each compute runs, each send is posted and each receive is waited on.
// One function, read by the executor that runs it and by the buffer plan (buffers.h) that
// must know when a buffer is taken and when a message is known to have landed.
//
// The rules (executor.h): before a compute action, the receives up to the next compute
// action are posted, except that a compute that frees a buffer (Backward, BackwardWeight)
// stops at the first activation receive (it would need a buffer the free makes); at a
// receive, every receive of its exchange (up to the next compute) is posted, then it is
// waited on; a send is posted where the list has it.
#pragma once

#include <vector>

#include "parallel/pipeline/schedule.h"

namespace mt::parallel::pp {

enum class ExecStepKind : uint8_t { kPostRecv, kCompute, kSend, kWaitRecv };

struct ExecStep {
  ExecStepKind kind = ExecStepKind::kCompute;
  int index = 0;  // the action's index in the rank's list
};

std::vector<ExecStep> execution_order(const std::vector<Action>& list);

}  // namespace mt::parallel::pp

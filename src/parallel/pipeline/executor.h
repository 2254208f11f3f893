// The pipeline executor: walks one rank's action list (schedule.h). Compute actions go to a
// Stage (the model chunks of this rank, provided by the trainer); activations and gradients
// travel by asynchronous send/recv on the pipeline group, tagged with message_tag(). Receives
// are posted early: those before the next compute action are posted before the current one
// runs (except an activation receive behind a backward, which would need one more buffer
// than the schedule's peak), all of an exchange's before the first is waited on, and each
// waited for where the list has them (execution_order, exec_order.h, spells the order out).
#pragma once

#include <cstdint>
#include <vector>

#include "comm/group.h"
#include "parallel/pipeline/exec_order.h"
#include "parallel/pipeline/schedule.h"

namespace mt::parallel::pp {

class Stage {
 public:
  virtual ~Stage() = default;
  // Runs a Forward, Backward, BackwardInput or BackwardWeight action.
  virtual void compute(const Action& a) = 0;
  // Where a receive lands / what a send reads (the stage assigns a buffer on first use).
  virtual comm::Buf recv_buffer(const Action& a) = 0;
  virtual comm::Buf send_buffer(const Action& a) = 0;
  // A send from send_buffer(a) was posted: the buffer must not be reused before `work`
  // is done (the stage keeps it with the buffer). All sends are done when run() returns.
  virtual void sent(const Action& /*a*/, const comm::WorkPtr& /*work*/) {}
};

// One timed event of a step (times in seconds from the step's start).
struct ExecEvent {
  Action action;
  double start_s = 0, end_s = 0;
  bool wait = false;  // a receive whose message had not arrived: the rank idled
};

class Executor {
 public:
  Executor(const Schedule& s, int rank, comm::Group& pp_group);
  // Runs this rank's list once (one training step). Events are kept until the next run.
  void run(Stage& stage);
  const std::vector<ExecEvent>& events() const { return events_; }

 private:
  const Schedule& s_;
  int rank_;
  comm::Group& group_;
  std::vector<ExecStep> order_;  // the list in the order run() performs it (exec_order.h)
  std::vector<ExecEvent> events_;
};

}  // namespace mt::parallel::pp

// Replays a schedule's action lists with a cost per action: the timeline the runtime would
// see if every action took exactly its cost. The same function serves the bubble tests
// (unit costs), the verifier's deadlock check, and the planner's simulator (real costs).
//
// Semantics (schedule.h): each rank runs its list in order. A compute action takes
// cost(rank, action). A send does not block its rank: its message arrives cost(rank, send)
// after it is issued (the transfer time). A receive waits until its message has arrived and
// then takes no time. If every unfinished rank waits on a message that no rank will ever
// send, the schedule deadlocks: replay throws mt::Error naming what each rank waits for.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "parallel/pipeline/schedule.h"

namespace mt::parallel::pp {

using CostFn = std::function<double(int rank, const Action& action)>;

// Forward = f, Backward = b (whole), BackwardInput = bi, BackwardWeight = bw, sends = comm.
CostFn unit_costs(double f = 1, double b = 2, double bi = 1, double bw = 1, double comm = 0);

struct Interval {
  int action = 0;  // index into the rank's list
  double start = 0, end = 0;
};

struct Timeline {
  std::vector<std::vector<Interval>> ranks;  // one interval per action, in list order
  double makespan = 0;
  std::vector<double> busy;  // compute time per rank
  std::vector<double> idle;  // makespan − busy, per rank

  // Σ idle / (pp · makespan): the fraction of the pipeline's time spent in bubbles.
  double bubble_fraction() const;
};

Timeline replay(const Schedule& s, const CostFn& cost);

// The same lists under blocking rendezvous point-to-point, as NCCL runs them on the compute
// stream (Megatron-LM's batch_isend_irecv, wait, torch.cuda.synchronize()): the communication
// actions between two compute actions of a rank form one batch, posted together when the rank
// reaches it. The batch moves once every message's sender and receiver have posted it; a
// message takes cost(sender, send), the batch's sends go one after another on the rank's link
// and so do its receives (full duplex: the batch takes the larger of the two sums). So a
// sender also waits for its receiver, and neighbours run in lock-step. Throws like replay() when
// the ranks wait on each other in a cycle (a schedule that would hang on NCCL).
Timeline replay_rendezvous(const Schedule& s, const CostFn& cost);

// A time-aligned grid of a replay (one column per rank, one row per unit of time, "." idle).
std::string format_timeline(const Schedule& s, const Timeline& t, double unit = 1);

}  // namespace mt::parallel::pp

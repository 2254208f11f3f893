// The activation buffers of each pipeline rank, planned from the schedule before the step
// runs: which buffer every (microbatch, chunk) of the rank uses, and how many buffers the
// rank allocates. One plan, read by the stage that runs it (train/pipeline_stage.h) and by
// the planner's memory model (plan/pipeline.h), so the two count the same buffers.
//
// A buffer is taken when its chunk's input receive is posted (or at the forward, for chunk 0)
// and freed after its backward; its input gradient is sent from it after that backward, so
// it may be taken again only once that send is done. The executor's sends are asynchronous,
// and a send completes only once its receive is issued: waiting for one whose receiver may
// itself be waiting for this rank deadlocks (pp 3, v 2, 16 microbatches did, 1 run in 4,
// when each rank took whichever free buffer it found first). So the plan walks the step
// with every rank as far as the messages let it (executor order, exec_order.h) and gives a
// (microbatch, chunk) a freed buffer only where the walk has already issued the receives of
// its sends. Every wait the executor then makes is for an event earlier in that walk, so no
// timing can close a cycle of waits: the executor runs every schedule the verifier accepts
// (buffered sends) without a deadlock. A rank starts with the schedule's peak in flight
// (peak_in_flight) plus one buffer, a receive posted while a freed buffer's send is still
// in flight, and takes the buffer freed longest ago; the walk adds one where a rank would
// otherwise wait forever (none of the schedules pp <= 8, m <= 3pp + 2, v <= 4 needs one).
#pragma once

#include <vector>

#include "parallel/pipeline/schedule.h"

namespace mt::parallel::pp {

struct BufferPlan {
  int num_chunks = 0;
  std::vector<int> buffers;             // per rank: buffers allocated
  std::vector<std::vector<int>> slots;  // per rank: [mb · num_chunks + chunk] → buffer, −1 if none
  int slot_of(int rank, int microbatch, int chunk) const {
    return slots[static_cast<size_t>(rank)]
                [static_cast<size_t>(microbatch) * static_cast<size_t>(num_chunks) +
                 static_cast<size_t>(chunk)];
  }
};

// Refuses (mt::Error) a schedule whose lists deadlock even with buffered sends (verify.h
// would too).
BufferPlan plan_buffers(const Schedule& s);

}  // namespace mt::parallel::pp

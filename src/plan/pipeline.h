// The pipeline as the planner sees it: the runtime's schedule IR
// (parallel/pipeline/schedule.h, DESIGN.md idea 3) built for a layout, the microbatches a
// rank holds from it, and its replay (parallel/pipeline/replay.h) with the planner's costs.
// The planner never builds schedules of its own.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "parallel/pipeline/replay.h"
#include "parallel/pipeline/schedule.h"

namespace mt::plan {

using PipeSchedule = parallel::pp::Schedule;
using PipeAction = parallel::pp::Action;
using PipeKind = parallel::pp::ActionKind;

// "gpipe", "1f1b", "interleaved", "zb1".
PipeSchedule make_schedule(const std::string& name, int stages, int chunks, int microbatches,
                           parallel::pp::Lowering lowering = parallel::pp::Lowering::kPerAction);

// The most microbatch-chunks a rank holds at once (forward done, backward not), per rank.
// spare_set: our runtime's stage holds the buffers of its plan (parallel/pipeline/buffers.h:
// one more set, for a receive posted while a released set's last send is in flight); Megatron's
// executors receive into p2p tensors (counted as communication buffers), so P − r is all 1F1B keeps
// there.
std::vector<int> max_in_flight(const PipeSchedule& s, bool spare_set);

// What each rank holds, chunk by chunk, at the moments its count of microbatch-chunks in
// flight peaks: after each forward that the rank's next compute action does not follow with
// another. Chunks can hold different numbers of layers (--pp-layers, Llama 3's lighter ends,
// an uneven split), so the rank's peak in bytes is the largest of these weighted by what a
// microbatch of each chunk keeps, which the count alone times the largest chunk only bounds.
struct ChunkFlight {
  // [rank][peak][local chunk c] (global chunk c·pp + rank): microbatches held.
  std::vector<std::vector<std::vector<int>>> peaks;
};
ChunkFlight chunk_flight(const PipeSchedule& s);
// The most bytes rank r holds at once when a microbatch of its local chunk c keeps bytes[c].
double peak_bytes_in_flight(const ChunkFlight& f, int rank, const std::vector<double>& bytes);

struct PipeSpan {
  PipeAction action;
  double start_s, end_s;
};

// A blocking exchange of a rank (P2p::kRendezvous): its messages, from when the rank posted
// them until the last has moved.
struct PipeExchange {
  std::vector<PipeAction> messages;
  double start_s, end_s;
};

struct ReplayResult {
  double makespan_s = 0;
  std::vector<double> busy_s;     // per rank
  std::vector<double> forward_s;  // per rank, the part of busy_s in forward actions (planner)
  std::vector<std::vector<PipeSpan>> spans;          // per rank, compute actions, when asked for
  std::vector<std::vector<PipeExchange>> exchanges;  // per rank, blocking exchanges, likewise
};

// How the pipeline's point-to-point transfers behave. kAsync: the runtime's replay semantics
// (a send's message arrives p2p_s after it is issued, the sender goes on, receives wait).
// kRendezvous: NCCL's blocking p2p (pp::replay_rendezvous): the communication between two
// compute actions is one batch; it moves once the rank and its peers have all posted it, its
// messages p2p_s each, one after another in each direction.
enum class P2p { kAsync, kRendezvous };

// cost(rank, compute action) in seconds; messages take p2p_s under `p2p`'s semantics.
ReplayResult replay(const PipeSchedule& s,
                    const std::function<double(int rank, const PipeAction&)>& cost, double p2p_s,
                    P2p p2p = P2p::kAsync, bool keep_spans = false);

// The same schedule on ranks that share one pool of processors (this-host: rank threads on a
// few cores). cost(rank, action) is the action's time when every rank of the job computes at
// once; while only `active` of the pipeline's ranks compute, each runs `speed(active)` times
// faster (processor sharing: the idle ranks' cores go to the busy ones). Time advances from
// event to event (an action ends, a message arrives); speed ≡ 1 gives replay()'s timeline.
// busy_s is each rank's work in cost units (its compute at the all-busy rate), so the
// pipeline's loss against a perfect one is makespan − max busy, as with replay().
ReplayResult replay_shared(const PipeSchedule& s,
                           const std::function<double(int rank, const PipeAction&)>& cost,
                           double p2p_s, const std::function<double(int active)>& speed,
                           bool keep_spans = false);

}  // namespace mt::plan

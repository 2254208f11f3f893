// The pipeline schedule IR (DESIGN.md, idea 3): a schedule is data. For each pipeline rank
// an ordered list of actions over (microbatch, chunk). The executor walks a rank's list,
// `replay` (replay.h) times the lists with any cost function, and `verify` (verify.h)
// proves them complete and free of deadlock. No schedule logic lives anywhere else.
//
// Chunks ("virtual stages") are numbered 0 .. pp·v − 1 in model order; chunk c lives on
// rank c mod pp (Megatron-LM's interleaved assignment; with v = 1 chunk c is rank c).
//
// Communication actions name the chunk on *this* rank that produces or consumes the
// tensor, and the peer rank:
//   SendAct(mb, c, peer = rank(c+1))   after Forward(mb, c): the output of chunk c
//   RecvAct(mb, c, peer = rank(c−1))   before Forward(mb, c): the input of chunk c
//   SendGrad(mb, c, peer = rank(c−1))  after Backward[Input](mb, c): d(input of chunk c)
//   RecvGrad(mb, c, peer = rank(c+1))  before Backward[Input](mb, c): d(output of chunk c)
// so SendAct(mb, c) matches RecvAct(mb, c + 1) and SendGrad(mb, c) matches
// RecvGrad(mb, c − 1). Neighbouring chunks on the same rank (pp = 1) hand over in memory,
// without actions. Semantics assumed by the verifier and used by the executor: a send is
// asynchronous (buffered: it never blocks the list), a receive blocks until its message
// has arrived; messages are matched by (kind, microbatch, chunk boundary), not by order.
// A schedule lowered for blocking exchanges (Lowering::kBatched) must also run to the end
// when a send waits for its receive (replay_rendezvous).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mt::parallel::pp {

enum class ActionKind : uint8_t {
  kForward,
  kBackward,        // input and weight gradients together
  kBackwardInput,   // zero-bubble "B": the input gradient only (what the previous stage waits for)
  kBackwardWeight,  // zero-bubble "W": the weight gradients (after its B)
  kSendAct,
  kRecvAct,
  kSendGrad,
  kRecvGrad,
};

struct Action {
  ActionKind kind = ActionKind::kForward;
  int microbatch = 0;
  int chunk = 0;  // global virtual stage, 0 .. pp·v − 1
  int peer = -1;  // pipeline rank of the other side (communication actions only)

  bool is_compute() const { return kind <= ActionKind::kBackwardWeight; }
  bool is_send() const { return kind == ActionKind::kSendAct || kind == ActionKind::kSendGrad; }
  bool is_recv() const { return kind == ActionKind::kRecvAct || kind == ActionKind::kRecvGrad; }
  bool operator==(const Action&) const = default;
};

enum class ScheduleKind : uint8_t { kGPipe, k1F1B, kInterleaved1F1B, kZbH1 };

// Where the send/recv actions go around the compute actions.
//  kPerAction: each compute action's receives right before it and its sends right after it.
//        What the executor runs (asynchronous sends, receives posted early).
//  kBatched: Megatron-LM's exchanges. A rank's compute goes in steps (each action a step,
//        except the interleaved schedule's steady state, where a forward and the backward
//        after it are one step); between two steps one exchange holds the sends of the step
//        before and the receives of the step after (send_forward_backward_recv_forward_backward).
//        This is the lowering for NCCL's blocking point-to-point, where a send waits for its
//        receive (replay_rendezvous): there the per-action lowering of the interleaved
//        schedule hangs (pp 2, v 2, 4 microbatches: rank 0 sends a gradient that rank 1
//        receives only after an exchange of its own whose gradient rank 0 receives only in its
//        next exchange), the batched one never does (tested over a range of pp, v, m). For
//        GPipe and 1F1B both lowerings give the same lists. ZB-H1's exchanges meet where its
//        asynchronous timeline (unit costs) has each message: the receive before its
//        consumer, the send after the producer rank's last compute that ends by then (a W
//        goes before 1F1B's send_backward_recv_forward, not inside it), so lock-step it keeps
//        the asynchronous makespan 3m + pp − 1 (docs/pipeline.md).
enum class Lowering : uint8_t { kPerAction, kBatched };

struct Schedule {
  ScheduleKind kind = ScheduleKind::k1F1B;
  int pp = 1;              // pipeline ranks
  int microbatches = 1;    // per step (per data-parallel replica)
  int virtual_stages = 1;  // chunks per rank (v)
  Lowering lowering = Lowering::kPerAction;
  std::vector<std::vector<Action>> ranks;  // pp lists

  int num_chunks() const { return pp * virtual_stages; }
  int rank_of_chunk(int chunk) const { return chunk % pp; }
  // The chunks of `rank` in model order: rank, rank + pp, ...
  std::vector<int> chunks_of_rank(int rank) const;
  bool split_backward() const { return kind == ScheduleKind::kZbH1; }
};

// "gpipe", "1f1b", "interleaved", "zb1" (the CLI's names) <-> kind.
ScheduleKind parse_schedule_kind(const std::string& name);
const char* schedule_kind_name(ScheduleKind kind);
const char* action_kind_name(ActionKind kind);  // "F", "B", "I", "W", "sa", "ra", "sg", "rg"
std::string format_action(const Action& a);     // e.g. "F3.1" (microbatch 3, chunk 1), "sa3.1>2"

// Refuses (mt::Error, exit code 2) a combination that cannot run, with the fix:
// pp, microbatches, v ≥ 1; v > 1 only for the interleaved schedule; microbatches < pp is
// refused for every schedule (most ranks would idle: torchtitan#775 hung there).
// build_schedule also refuses the interleaved schedule's batched lowering unless pp divides
// the microbatches (Megatron-LM's rule; the per-action lowering takes any count).
void check_schedule_args(ScheduleKind kind, int pp, int microbatches, int virtual_stages);

// Builds the schedule (compute order per rank, then the send/recv lowering):
//  GPipe: all forwards, then all backwards (Huang et al. 2019).
//  1F1B: pp − rank − 1 warm-up forwards, then one forward / one backward, then the
//        remaining backwards (PipeDream-Flush, Narayanan et al. 2021).
//  Interleaved 1F1B: Megatron-LM's order over v chunks per rank (Narayanan et al., SC 2021):
//        warm-up (pp − rank − 1)·2 + (v − 1)·N forward units, microbatches in groups of
//        N ≥ pp (floor(m / pp) groups as equal as they divide; N = pp when pp divides m).
//  ZB-H1: backward split into B (input) and W (weights); 1F1B's order of F and B with the same
//        cap on microbatches in flight (pp − rank), W deferred into the slots where the rank
//        would wait (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, §3.1).
Schedule build_schedule(ScheduleKind kind, int pp, int microbatches, int virtual_stages = 1,
                        Lowering lowering = Lowering::kPerAction);

// The message a communication action sends or receives, the same number on both sides:
// activations crossing boundary c | c + 1 of microbatch mb, or gradients crossing it. The
// executor uses it as the send/recv tag; the verifier and replay match on it.
int message_tag(const Schedule& s, const Action& a);

// Inserts the communication actions around the compute actions of `steps` (per rank, its
// compute actions in order, grouped in steps), as described at the top of this file: the
// receives of a step before it, its sends after it. One action per step is kPerAction.
Schedule lower_communication(ScheduleKind kind, int pp, int microbatches, int virtual_stages,
                             Lowering lowering,
                             const std::vector<std::vector<std::vector<Action>>>& steps);

// A grid like torch.distributed.pipelining's: one column per rank, one row per step of the
// compute lists (communication shown with `with_comm`).
std::string format_grid(const Schedule& s, bool with_comm = false);

// Microbatches whose activations a rank holds at once: Forward done and Backward (or
// BackwardWeight) not yet, counted per (microbatch, chunk) — the pool size the executor
// allocates. One entry per rank.
std::vector<int> peak_in_flight(const Schedule& s);

}  // namespace mt::parallel::pp

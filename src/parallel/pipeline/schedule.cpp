#include "parallel/pipeline/schedule.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "parallel/pipeline/replay.h"

namespace mt::parallel::pp {

std::vector<int> Schedule::chunks_of_rank(int rank) const {
  std::vector<int> c;
  for (int k = 0; k < virtual_stages; ++k) c.push_back(k * pp + rank);
  return c;
}

ScheduleKind parse_schedule_kind(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::kGPipe;
  if (name == "1f1b") return ScheduleKind::k1F1B;
  if (name == "interleaved" || name == "interleaved1f1b") return ScheduleKind::kInterleaved1F1B;
  if (name == "zb1" || name == "zbh1" || name == "zb-h1") return ScheduleKind::kZbH1;
  fail("unknown --schedule '{}' (choose gpipe, 1f1b, interleaved or zb1)", name);
}

const char* schedule_kind_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return "gpipe";
    case ScheduleKind::k1F1B:
      return "1f1b";
    case ScheduleKind::kInterleaved1F1B:
      return "interleaved";
    case ScheduleKind::kZbH1:
      return "zb1";
  }
  return "?";
}

const char* action_kind_name(ActionKind kind) {
  switch (kind) {
    case ActionKind::kForward:
      return "F";
    case ActionKind::kBackward:
      return "B";
    case ActionKind::kBackwardInput:
      return "I";
    case ActionKind::kBackwardWeight:
      return "W";
    case ActionKind::kSendAct:
      return "sa";
    case ActionKind::kRecvAct:
      return "ra";
    case ActionKind::kSendGrad:
      return "sg";
    case ActionKind::kRecvGrad:
      return "rg";
  }
  return "?";
}

std::string format_action(const Action& a) {
  std::string s = fmt::format("{}{}.{}", action_kind_name(a.kind), a.microbatch, a.chunk);
  if (!a.is_compute()) {
    const bool send = a.is_send();
    s += fmt::format("{}{}", send ? ">" : "<", a.peer);
  }
  return s;
}

void check_schedule_args(ScheduleKind kind, int pp, int microbatches, int virtual_stages) {
  if (pp < 1) fail("--pp {} must be at least 1", pp);
  if (microbatches < 1) fail("--microbatches {} must be at least 1", microbatches);
  if (virtual_stages < 1) fail("--virtual-stages {} must be at least 1", virtual_stages);
  if (virtual_stages > 1 && kind != ScheduleKind::kInterleaved1F1B)
    fail("--virtual-stages {} needs --schedule interleaved ({} runs one chunk per rank)",
         virtual_stages, schedule_kind_name(kind));
  if (microbatches < pp)
    fail(
        "--microbatches {} is fewer than --pp {}: at least one pipeline rank would never have "
        "work in flight (use --microbatches {} or more, or a smaller --pp)",
        microbatches, pp, pp);
}

namespace {

Action compute(ActionKind k, int mb, int chunk) { return Action{k, mb, chunk, -1}; }

std::vector<std::vector<Action>> gpipe_order(int pp, int m) {
  std::vector<std::vector<Action>> out(static_cast<size_t>(pp));
  for (int r = 0; r < pp; ++r) {
    for (int mb = 0; mb < m; ++mb) out[r].push_back(compute(ActionKind::kForward, mb, r));
    for (int mb = 0; mb < m; ++mb) out[r].push_back(compute(ActionKind::kBackward, mb, r));
  }
  return out;
}

std::vector<std::vector<Action>> one_f_one_b_order(int pp, int m) {
  std::vector<std::vector<Action>> out(static_cast<size_t>(pp));
  for (int r = 0; r < pp; ++r) {
    const int warmup = std::min(pp - r - 1, m);
    int f = 0, b = 0;
    for (; f < warmup; ++f) out[r].push_back(compute(ActionKind::kForward, f, r));
    while (f < m) {
      out[r].push_back(compute(ActionKind::kForward, f++, r));
      out[r].push_back(compute(ActionKind::kBackward, b++, r));
    }
    while (b < m) out[r].push_back(compute(ActionKind::kBackward, b++, r));
  }
  return out;
}

// A rank's compute actions grouped in steps (see Lowering).
using Steps = std::vector<std::vector<Action>>;

// Megatron-LM's interleaved order (forward_backward_pipelining_with_interleaving) for any
// number of microbatches m ≥ pp: the microbatches in floor(m / pp) groups of consecutive
// microbatches, as equal as they divide (the first ones one larger), so every group has pp
// or more (Llama 3's N, "the number of contiguous micro-batches for the same stage's forward
// or backward"; PyTorch's Interleaved1F1B rounds, which need them equal). Each group goes
// through the rank's chunks in turn, every microbatch of the group on a chunk before the
// next chunk; forward unit k is that table's k-th (microbatch, local chunk), backward unit k
// the same with the local chunks the other way; the warm-up is (pp − rank − 1)·2 + (v − 1)·N
// forward units, N the first group's size. With m a multiple of pp every group has pp:
// forward unit k is microbatch (k / (pp·v))·pp + k mod pp on local chunk (k mod (pp·v)) /
// pp, Megatron-LM's. (Groups of pp with a last group smaller than pp, as Megatron-Core's
// schedule table builds them at its default group size, deadlock with this warm-up and
// asynchronous sends: the verifier finds it.) In Megatron's steps: the warm-up's forwards
// one per step, then steps of one forward and one backward, then the cool-down's backwards
// one per step.
std::vector<Steps> interleaved_steps(int pp, int m, int v) {
  std::vector<std::pair<int, int>> table;  // (microbatch, local chunk) per unit
  const int groups = std::max(1, m / pp), first = (m + groups - 1) / groups;
  for (int g = 0, g0 = 0; g < groups; ++g) {
    const int g1 = g0 + m / groups + (g < m % groups ? 1 : 0);
    for (int local = 0; local < v; ++local)
      for (int mb = g0; mb < g1; ++mb) table.emplace_back(mb, local);
    g0 = g1;
  }
  std::vector<Steps> out(static_cast<size_t>(pp));
  const int total = m * v;
  for (int r = 0; r < pp; ++r) {
    auto unit = [&](int k, bool forward) {
      const auto [mb, local] = table[static_cast<size_t>(k)];
      const int chunk = (forward ? local : v - 1 - local) * pp + r;
      return compute(forward ? ActionKind::kForward : ActionKind::kBackward, mb, chunk);
    };
    const int warmup = std::min((pp - r - 1) * 2 + (v - 1) * first, total);
    int f = 0, b = 0;
    for (; f < warmup; ++f) out[r].push_back({unit(f, true)});
    while (f < total) out[r].push_back({unit(f++, true), unit(b++, false)});
    while (b < total) out[r].push_back({unit(b++, false)});
  }
  return out;
}

// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, §3.1, Fig. 3): 1F1B's
// order of forwards and backward-inputs, with rank r's W of microbatch j placed right after
// its backward-input of microbatch j + r (the first rank does W at once, the last defers
// pp − 1 of them), the rest at the end. So the W's fill the slots where 1F1B's later ranks
// wait in the cool-down, and every rank holds at most pp microbatches (F done, W not yet):
// 1F1B's peak, that of its first rank ("the maximum peak memory over all workers does not
// exceed 1F1B's").
std::vector<std::vector<Action>> zb_h1_order(int pp, int m) {
  std::vector<std::vector<Action>> out = one_f_one_b_order(pp, m);
  for (int r = 0; r < pp; ++r) {
    std::vector<Action> list;
    int next_w = 0;
    for (Action a : out[r]) {
      if (a.kind != ActionKind::kBackward) {
        list.push_back(a);
        continue;
      }
      a.kind = ActionKind::kBackwardInput;
      list.push_back(a);
      if (a.microbatch - r >= 0) list.push_back(compute(ActionKind::kBackwardWeight, next_w++, r));
    }
    while (next_w < m) list.push_back(compute(ActionKind::kBackwardWeight, next_w++, r));
    out[r] = std::move(list);
  }
  return out;
}

// One step per compute action.
std::vector<Steps> one_per_step(const std::vector<std::vector<Action>>& order) {
  std::vector<Steps> steps(order.size());
  for (size_t r = 0; r < order.size(); ++r)
    for (const Action& a : order[r]) steps[r].push_back({a});
  return steps;
}

}  // namespace

Schedule lower_communication(ScheduleKind kind, int pp, int microbatches, int virtual_stages,
                             Lowering lowering,
                             const std::vector<std::vector<std::vector<Action>>>& steps) {
  Schedule s;
  s.kind = kind;
  s.lowering = lowering;
  s.pp = pp;
  s.microbatches = microbatches;
  s.virtual_stages = virtual_stages;
  s.ranks.resize(static_cast<size_t>(pp));
  const int last = s.num_chunks() - 1;
  for (int r = 0; r < pp; ++r) {
    auto& list = s.ranks[r];
    // The neighbouring chunks' ranks, or -1 where the tensor stays on this rank.
    auto prev = [&](const Action& a) {
      const int p = a.chunk > 0 ? s.rank_of_chunk(a.chunk - 1) : -1;
      return p == r ? -1 : p;
    };
    auto next = [&](const Action& a) {
      const int n = a.chunk < last ? s.rank_of_chunk(a.chunk + 1) : -1;
      return n == r ? -1 : n;
    };
    auto is_fwd = [](const Action& a) { return a.kind == ActionKind::kForward; };
    auto is_bwd = [](const Action& a) {
      return a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardInput;
    };
    for (const auto& step : steps[r]) {
      for (const Action& a : step) {
        if (is_fwd(a) && prev(a) >= 0)
          list.push_back({ActionKind::kRecvAct, a.microbatch, a.chunk, prev(a)});
        if (is_bwd(a) && next(a) >= 0)
          list.push_back({ActionKind::kRecvGrad, a.microbatch, a.chunk, next(a)});
      }
      for (const Action& a : step) list.push_back(a);
      for (const Action& a : step) {
        if (is_fwd(a) && next(a) >= 0)
          list.push_back({ActionKind::kSendAct, a.microbatch, a.chunk, next(a)});
        if (is_bwd(a) && prev(a) >= 0)
          list.push_back({ActionKind::kSendGrad, a.microbatch, a.chunk, prev(a)});
      }
    }
  }
  return s;
}

namespace {

// ZB-H1's exchanges for blocking point-to-point (Lowering::kBatched). One action per step
// does not pair ZB-H1's exchanges: a W between a backward-input and the next forward splits
// 1F1B's send_backward_recv_forward in two, {sg} | W | {ra}, and the neighbour's
// send_forward_recv_backward {sa, rg} then needs both halves — it waits for this rank's W
// (the W sits on the neighbour's critical path), every cycle, so the bubble grows with the
// microbatches (pp 8, m 32: 133 against 1F1B's 117 and 103 asynchronously). As zero-bubble's
// implementation does (sail-sg/zero-bubble-pipeline-parallelism: communication placed by its
// time in the schedule's own timeline, the send and its receive at the same time), each
// message meets where the asynchronous replay (unit costs, F = I = W = 1) has it: the
// receive right before its consumer, which starts at time T there, and the send after the
// producer rank's last compute that ends by T (so after the producer and never later than
// the consumer needs it). Every exchange then holds messages that meet at one time on both
// sides, so the lock-step replay is the asynchronous one (3m + p − 1, tested for pp ≤ 8,
// m ≤ 8·pp); in the steady state a rank runs I, W, {sg, ra}, F, {sa, rg}: 1F1B's paired
// exchanges with the W before the exchange instead of inside it. Only sends move, by at
// most one compute action and never past the W of their own microbatch (the buffer they
// read is still held); receives stay where the per-action lists have them.
Schedule timed_exchanges(ScheduleKind kind, int pp, int m,
                         const std::vector<std::vector<Action>>& order) {
  const Schedule async =
      lower_communication(kind, pp, m, 1, Lowering::kPerAction, one_per_step(order));
  const Timeline t = replay(async, unit_costs(1, 2, 1, 1, 0));
  // start / end of each rank's compute actions, in order.
  std::vector<std::vector<double>> start(static_cast<size_t>(pp)), end(static_cast<size_t>(pp));
  for (int r = 0; r < pp; ++r)
    for (const Interval& iv : t.ranks[r])
      if (async.ranks[r][static_cast<size_t>(iv.action)].is_compute()) {
        start[r].push_back(iv.start);
        end[r].push_back(iv.end);
      }
  // Where each rank's forward and backward(-input) of each microbatch sit in its order.
  std::vector<std::vector<size_t>> fwd_at(static_cast<size_t>(pp)), bwd_at(static_cast<size_t>(pp));
  for (int r = 0; r < pp; ++r) {
    fwd_at[r].assign(static_cast<size_t>(m), 0);
    bwd_at[r].assign(static_cast<size_t>(m), 0);
    for (size_t i = 0; i < order[r].size(); ++i) {
      const Action& a = order[r][i];
      if (a.kind == ActionKind::kForward) fwd_at[r][a.microbatch] = i;
      if (a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardInput)
        bwd_at[r][a.microbatch] = i;
    }
  }
  // sends[r][i]: the sends after compute i − 1 of rank r (i = 0 .. n); recvs[r][i]: the
  // receives before compute i.
  std::vector<std::vector<std::vector<Action>>> sends(static_cast<size_t>(pp)),
      recvs(static_cast<size_t>(pp));
  for (int r = 0; r < pp; ++r) {
    sends[r].resize(order[r].size() + 1);
    recvs[r].resize(order[r].size());
  }
  for (int r = 0; r < pp; ++r)
    for (size_t i = 0; i < order[r].size(); ++i) {
      const Action& a = order[r][i];
      const bool fwd = a.kind == ActionKind::kForward;
      const bool bwd = a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardInput;
      const int from = fwd ? r - 1 : r + 1;  // the producer's rank
      if (!(fwd || bwd) || from < 0 || from >= pp) continue;
      recvs[r][i].push_back(
          {fwd ? ActionKind::kRecvAct : ActionKind::kRecvGrad, a.microbatch, r, from});
      size_t j = (fwd ? fwd_at : bwd_at)[from][a.microbatch];  // its producer (F, or B / I)
      while (j + 1 < order[from].size() && end[from][j + 1] <= start[r][i]) ++j;
      sends[from][j + 1].push_back(
          {fwd ? ActionKind::kSendAct : ActionKind::kSendGrad, a.microbatch, from, r});
    }
  Schedule s;
  s.kind = kind;
  s.lowering = Lowering::kBatched;
  s.pp = pp;
  s.microbatches = m;
  s.ranks.resize(static_cast<size_t>(pp));
  for (int r = 0; r < pp; ++r) {
    auto& list = s.ranks[r];
    // An exchange: the sends first, as lower_communication has them (the executor issues
    // them before it waits on the receives, so a grouping backend runs them as one group).
    for (size_t i = 0; i < order[r].size(); ++i) {
      list.insert(list.end(), sends[r][i].begin(), sends[r][i].end());
      list.insert(list.end(), recvs[r][i].begin(), recvs[r][i].end());
      list.push_back(order[r][i]);
    }
    list.insert(list.end(), sends[r].back().begin(), sends[r].back().end());
  }
  return s;
}

}  // namespace

Schedule build_schedule(ScheduleKind kind, int pp, int microbatches, int virtual_stages,
                        Lowering lowering) {
  check_schedule_args(kind, pp, microbatches, virtual_stages);
  // Lock-step exchanges pair a rank's sends with its neighbour's receives in order; with
  // groups of more than pp microbatches they do not (the verifier finds deadlocks).
  if (kind == ScheduleKind::kInterleaved1F1B && lowering == Lowering::kBatched &&
      microbatches % pp != 0)
    fail(
        "the interleaved schedule's batched exchanges (Megatron-LM's, the default on NCCL, "
        "whose sends wait for their receives) need --microbatches divisible by --pp: {} is not "
        "a multiple of {} (use {} or {}; the per-action lowering takes any count)",
        microbatches, pp, microbatches / pp * pp, (microbatches / pp + 1) * pp);
  std::vector<Steps> steps;
  switch (kind) {
    case ScheduleKind::kGPipe:
      steps = one_per_step(gpipe_order(pp, microbatches));
      break;
    case ScheduleKind::k1F1B:
      steps = one_per_step(one_f_one_b_order(pp, microbatches));
      break;
    case ScheduleKind::kInterleaved1F1B:
      steps = interleaved_steps(pp, microbatches, virtual_stages);
      break;
    case ScheduleKind::kZbH1:
      if (lowering == Lowering::kBatched)
        return timed_exchanges(kind, pp, microbatches, zb_h1_order(pp, microbatches));
      steps = one_per_step(zb_h1_order(pp, microbatches));
      break;
  }
  // Per action: every compute action a step of its own.
  if (lowering == Lowering::kPerAction)
    for (Steps& rank : steps) {
      Steps single;
      for (const auto& step : rank)
        for (const Action& a : step) single.push_back({a});
      rank = std::move(single);
    }
  return lower_communication(kind, pp, microbatches, virtual_stages, lowering, steps);
}

std::string format_grid(const Schedule& s, bool with_comm) {
  std::vector<std::vector<std::string>> cols(static_cast<size_t>(s.pp));
  size_t rows = 0, width = 6;
  for (int r = 0; r < s.pp; ++r) {
    for (const Action& a : s.ranks[r])
      if (with_comm || a.is_compute()) cols[r].push_back(format_action(a));
    rows = std::max(rows, cols[r].size());
    for (const auto& c : cols[r]) width = std::max(width, c.size());
  }
  std::string out = fmt::format("{:<5}", "step");
  for (int r = 0; r < s.pp; ++r) out += fmt::format(" {:<{}}", fmt::format("rank {}", r), width);
  out += "\n";
  for (size_t i = 0; i < rows; ++i) {
    out += fmt::format("{:<5}", i);
    for (int r = 0; r < s.pp; ++r)
      out += fmt::format(" {:<{}}", i < cols[r].size() ? cols[r][i] : "", width);
    while (!out.empty() && out.back() == ' ') out.pop_back();
    out += "\n";
  }
  return out;
}

int message_tag(const Schedule& s, const Action& a) {
  int grad = 0, boundary = 0;
  switch (a.kind) {
    case ActionKind::kSendAct:
      boundary = a.chunk;
      break;
    case ActionKind::kRecvAct:
      boundary = a.chunk - 1;
      break;
    case ActionKind::kSendGrad:
      grad = 1, boundary = a.chunk - 1;
      break;
    case ActionKind::kRecvGrad:
      grad = 1, boundary = a.chunk;
      break;
    default:
      MT_ASSERT(!"message_tag of a compute action");
  }
  return (grad * s.microbatches + a.microbatch) * s.num_chunks() + boundary;
}

std::vector<int> peak_in_flight(const Schedule& s) {
  std::vector<int> peak(static_cast<size_t>(s.pp), 0);
  for (int r = 0; r < s.pp; ++r) {
    int now = 0;
    for (const Action& a : s.ranks[r]) {
      if (a.kind == ActionKind::kForward) peak[r] = std::max(peak[r], ++now);
      if (a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardWeight) --now;
    }
  }
  return peak;
}

}  // namespace mt::parallel::pp

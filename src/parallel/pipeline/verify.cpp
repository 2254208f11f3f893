#include "parallel/pipeline/verify.h"

#include <fmt/format.h>

#include <map>
#include <tuple>

#include "core/error.h"
#include "parallel/pipeline/replay.h"

namespace mt::parallel::pp {

namespace {

// Position of each (kind, microbatch, chunk) on its rank; -1 absent.
struct Index {
  int P, M, C;
  std::vector<int> pos;  // [kind][mb][chunk]
  Index(int p, int m, int c) : P(p), M(m), C(c), pos(8 * m * c, -1) {}
  int& at(ActionKind k, int mb, int c) { return pos[(static_cast<int>(k) * M + mb) * C + c]; }
};

std::string check(const Schedule& s) {
  const int P = s.pp, M = s.microbatches, C = s.num_chunks();
  if (P < 1 || M < 1 || s.virtual_stages < 1) return "pp, microbatches and v must be >= 1";
  if (static_cast<int>(s.ranks.size()) != P)
    return fmt::format("{} action lists for pp = {}", s.ranks.size(), P);
  Index idx(P, M, C);
  for (int r = 0; r < P; ++r) {
    const auto& list = s.ranks[r];
    for (size_t i = 0; i < list.size(); ++i) {
      const Action& a = list[i];
      const std::string where = fmt::format("rank {} action {} ({})", r, i, format_action(a));
      if (a.microbatch < 0 || a.microbatch >= M) return where + ": microbatch out of range";
      if (a.chunk < 0 || a.chunk >= C) return where + ": chunk out of range";
      if (s.rank_of_chunk(a.chunk) != r)
        return fmt::format("{}: chunk {} lives on rank {}", where, a.chunk,
                           s.rank_of_chunk(a.chunk));
      int& p = idx.at(a.kind, a.microbatch, a.chunk);
      if (p >= 0) return fmt::format("{}: repeated (first at action {})", where, p);
      p = static_cast<int>(i);
      if (!a.is_compute()) {
        const bool act = a.kind == ActionKind::kSendAct || a.kind == ActionKind::kRecvAct;
        const bool send = a.is_send();
        // Activations flow up the chunks, gradients down.
        const int other = (act == send) ? a.chunk + 1 : a.chunk - 1;
        if (other < 0 || other >= C) return where + ": no chunk on the other side";
        if (a.peer != s.rank_of_chunk(other))
          return fmt::format("{}: peer should be rank {} (chunk {})", where, s.rank_of_chunk(other),
                             other);
        if (a.peer == r)
          return where + ": a message to itself (same-rank chunks hand over in memory)";
      }
    }
  }
  const bool split = s.split_backward();
  for (int mb = 0; mb < M; ++mb)
    for (int c = 0; c < C; ++c) {
      const int r = s.rank_of_chunk(c);
      const std::string what = fmt::format("microbatch {} chunk {} (rank {})", mb, c, r);
      const int f = idx.at(ActionKind::kForward, mb, c);
      const int b = idx.at(ActionKind::kBackward, mb, c);
      const int bi = idx.at(ActionKind::kBackwardInput, mb, c);
      const int bw = idx.at(ActionKind::kBackwardWeight, mb, c);
      if (f < 0) return what + ": no forward";
      if (split) {
        if (b >= 0) return what + ": a whole backward in a split-backward schedule";
        if (bi < 0) return what + ": no backward-input";
        if (bw < 0) return what + ": no backward-weight";
        if (bw < bi) return what + ": backward-weight before its backward-input";
      } else {
        if (bi >= 0 || bw >= 0) return what + ": split backward in a whole-backward schedule";
        if (b < 0) return what + ": no backward";
      }
      const int back = split ? bi : b;
      if (back < f) return what + ": backward before its forward";
      // Forward dependency on chunk c - 1.
      if (c > 0) {
        const int pr = s.rank_of_chunk(c - 1);
        if (pr == r) {
          if (idx.at(ActionKind::kForward, mb, c - 1) > f)
            return what + ": forward before the forward of chunk " + std::to_string(c - 1);
        } else {
          const int recv = idx.at(ActionKind::kRecvAct, mb, c);
          if (recv < 0 || recv > f) return what + ": no receive of its input before the forward";
          const int send = idx.at(ActionKind::kSendAct, mb, c - 1);
          if (send < 0) return what + ": rank " + std::to_string(pr) + " never sends its input";
          if (send < idx.at(ActionKind::kForward, mb, c - 1))
            return what + ": its input is sent before it is computed";
        }
      }
      // Backward dependency on chunk c + 1.
      if (c + 1 < C) {
        const int nr = s.rank_of_chunk(c + 1);
        const int next_back =
            idx.at(split ? ActionKind::kBackwardInput : ActionKind::kBackward, mb, c + 1);
        if (nr == r) {
          if (next_back > back)
            return what + ": backward before the backward of chunk " + std::to_string(c + 1);
        } else {
          const int recv = idx.at(ActionKind::kRecvGrad, mb, c);
          if (recv < 0 || recv > back)
            return what + ": no receive of its output gradient before the backward";
          const int send = idx.at(ActionKind::kSendGrad, mb, c + 1);
          if (send < 0) return what + ": rank " + std::to_string(nr) + " never sends its gradient";
          if (send < next_back) return what + ": its gradient is sent before it is computed";
        }
      }
      // Nothing sent that nobody receives (and sends follow their producer).
      if (c + 1 < C && s.rank_of_chunk(c + 1) != r) {
        const int send = idx.at(ActionKind::kSendAct, mb, c);
        if (send < 0) return what + ": output never sent";
        if (idx.at(ActionKind::kRecvAct, mb, c + 1) < 0) return what + ": output never received";
      } else if (idx.at(ActionKind::kSendAct, mb, c) >= 0) {
        return what + ": sends an activation nobody needs";
      }
      if (c > 0 && s.rank_of_chunk(c - 1) != r) {
        if (idx.at(ActionKind::kSendGrad, mb, c) < 0) return what + ": input gradient never sent";
        if (idx.at(ActionKind::kRecvGrad, mb, c - 1) < 0)
          return what + ": input gradient never received";
        if (idx.at(ActionKind::kSendGrad, mb, c) < back)
          return what + ": input gradient sent before it is computed";
      } else if (idx.at(ActionKind::kSendGrad, mb, c) >= 0) {
        return what + ": sends a gradient nobody needs";
      }
      if ((c == 0 || s.rank_of_chunk(c - 1) == r) && idx.at(ActionKind::kRecvAct, mb, c) >= 0)
        return what + ": receives an input no rank sends";
      if ((c + 1 == C || s.rank_of_chunk(c + 1) == r) && idx.at(ActionKind::kRecvGrad, mb, c) >= 0)
        return what + ": receives a gradient no rank sends";
    }
  return "";
}

// NCCL matches a pair's messages in the order they are issued, not by tag: with blocking
// exchanges each rank must send to a peer in the order that peer receives.
std::string check_pair_order(const Schedule& s) {
  std::map<std::pair<int, int>, std::vector<int>> sent, received;  // (from, to) -> tags
  for (int r = 0; r < s.pp; ++r)
    for (const Action& a : s.ranks[r]) {
      if (a.is_send())
        sent[{r, a.peer}].push_back(message_tag(s, a));
      else if (a.is_recv())
        received[{a.peer, r}].push_back(message_tag(s, a));
    }
  for (const auto& [pair, tags] : sent)
    if (received[pair] != tags)
      return fmt::format(
          "rank {} sends to rank {} in another order than rank {} receives (blocking exchanges "
          "match in order)",
          pair.first, pair.second, pair.second);
  return "";
}

}  // namespace

std::string verify(const Schedule& s) {
  std::string err = check(s);
  if (err.empty() && s.lowering == Lowering::kBatched) err = check_pair_order(s);
  if (!err.empty()) return err;
  try {
    replay(s, unit_costs());
    // Batched exchanges are meant for NCCL's blocking point-to-point: they must not hang there.
    if (s.lowering == Lowering::kBatched) replay_rendezvous(s, unit_costs());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void verify_or_throw(const Schedule& s) {
  const std::string err = verify(s);
  if (!err.empty())
    fail_run("pipeline schedule {} (pp {}, microbatches {}, v {}) is invalid: {}",
             schedule_kind_name(s.kind), s.pp, s.microbatches, s.virtual_stages, err);
}

}  // namespace mt::parallel::pp

#include "plan/pipeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <unordered_map>

#include "core/error.h"
#include "parallel/pipeline/buffers.h"

namespace mt::plan {

namespace pp = parallel::pp;

PipeSchedule make_schedule(const std::string& name, int P, int v, int m, pp::Lowering lowering) {
  return pp::build_schedule(pp::parse_schedule_kind(name), P, m, v, lowering);
}

// Microbatch activation buffers a pipeline rank holds: the schedule's peak, or (spare_set) the
// buffers our runtime's stage allocates before the first step, its buffer plan
// (parallel/pipeline/buffers.h: the peak + 1 for a receive posted while a released buffer's
// last send is in flight, more where the plan's walk needs them).
std::vector<int> max_in_flight(const PipeSchedule& s, bool spare_set) {
  if (s.pp > 1 && spare_set) return pp::plan_buffers(s).buffers;
  return pp::peak_in_flight(s);
}

ChunkFlight chunk_flight(const PipeSchedule& s) {
  ChunkFlight f;
  f.peaks.resize(static_cast<size_t>(s.pp));
  const auto v = static_cast<size_t>(s.virtual_stages);
  for (int r = 0; r < s.pp; ++r) {
    const auto& list = s.ranks[static_cast<size_t>(r)];
    std::vector<int> held(v, 0);
    std::set<std::vector<int>> peaks;  // a steady state repeats the same few
    bool rising = false;               // the last compute action was a forward
    for (const PipeAction& a : list) {
      if (!a.is_compute()) continue;
      const auto c = static_cast<size_t>(a.chunk / s.pp);
      if (a.kind == PipeKind::kForward) {
        ++held[c];
        rising = true;
        continue;
      }
      if (rising) peaks.insert(held);
      rising = false;
      if (a.kind == PipeKind::kBackward || a.kind == PipeKind::kBackwardWeight) --held[c];
    }
    if (rising) peaks.insert(held);
    f.peaks[static_cast<size_t>(r)].assign(peaks.begin(), peaks.end());
  }
  return f;
}

double peak_bytes_in_flight(const ChunkFlight& f, int rank, const std::vector<double>& bytes) {
  double peak = 0;
  for (const std::vector<int>& held : f.peaks.at(static_cast<size_t>(rank))) {
    double sum = 0;
    for (size_t c = 0; c < held.size(); ++c) sum += held[c] * bytes.at(c);
    peak = std::max(peak, sum);
  }
  return peak;
}

ReplayResult replay(const PipeSchedule& s,
                    const std::function<double(int, const PipeAction&)>& cost, double p2p_s,
                    P2p p2p, bool keep_spans) {
  const pp::CostFn costs = [&](int rank, const pp::Action& a) {
    if (a.is_compute()) return cost(rank, a);
    if (a.is_send()) return p2p_s;
    return 0.0;
  };
  const pp::Timeline t =
      p2p == P2p::kRendezvous ? pp::replay_rendezvous(s, costs) : pp::replay(s, costs);
  ReplayResult r;
  r.makespan_s = t.makespan;
  r.busy_s = t.busy;
  if (keep_spans) {
    r.spans.resize(t.ranks.size());
    r.exchanges.resize(t.ranks.size());
    for (size_t k = 0; k < t.ranks.size(); ++k) {
      int last_comm = -2;  // the list index of the rank's previous communication action
      for (const pp::Interval& iv : t.ranks[k]) {
        const PipeAction& a = s.ranks[k][static_cast<size_t>(iv.action)];
        if (a.is_compute()) {
          r.spans[k].push_back({a, iv.start, iv.end});
          continue;
        }
        // Rendezvous: the communication actions between two compute actions are one batch.
        if (p2p == P2p::kRendezvous) {
          if (iv.action != last_comm + 1) r.exchanges[k].push_back({{}, iv.start, iv.end});
          r.exchanges[k].back().messages.push_back(a);
        }
        last_comm = iv.action;
      }
    }
  }
  return r;
}

ReplayResult replay_shared(const PipeSchedule& s,
                           const std::function<double(int, const PipeAction&)>& cost, double p2p_s,
                           const std::function<double(int)>& speed, bool keep_spans) {
  const int P = s.pp;
  const auto n = static_cast<size_t>(P);
  std::vector<size_t> next(n, 0);
  std::vector<double> left(n, 0);   // work left in the running compute action (cost units)
  std::vector<double> start(n, 0);  // when it started
  std::vector<bool> computing(n, false);
  std::unordered_map<int, double> arrives;  // message tag -> arrival time
  ReplayResult r;
  r.busy_s.assign(n, 0);
  if (keep_spans) r.spans.resize(n);
  double now = 0;
  for (;;) {
    // Every rank not computing runs its zero-time actions at `now` until it starts a compute
    // action or waits for a message that has not arrived.
    bool all_done = true;
    for (int k = 0; k < P; ++k) {
      const auto& list = s.ranks[static_cast<size_t>(k)];
      size_t& i = next[static_cast<size_t>(k)];
      while (!computing[static_cast<size_t>(k)] && i < list.size()) {
        const PipeAction& a = list[i];
        if (a.is_recv()) {
          auto it = arrives.find(parallel::pp::message_tag(s, a));
          if (it == arrives.end() || it->second > now) break;
          arrives.erase(it);
          ++i;
        } else if (a.is_send()) {
          arrives[parallel::pp::message_tag(s, a)] = now + p2p_s;
          ++i;
        } else if (const double c = cost(k, a); c > 0) {
          computing[static_cast<size_t>(k)] = true;
          left[static_cast<size_t>(k)] = c;
          start[static_cast<size_t>(k)] = now;
        } else {
          ++i;
        }
      }
      if (i < list.size()) all_done = false;
    }
    if (all_done) break;
    // The next event: the first running action to end at the current speed, or the first
    // awaited message to arrive.
    int active = 0;
    for (int k = 0; k < P; ++k) active += computing[static_cast<size_t>(k)] ? 1 : 0;
    const double v = active > 0 ? speed(active) : 1.0;
    double t_next = std::numeric_limits<double>::infinity();
    for (int k = 0; k < P; ++k) {
      const auto u = static_cast<size_t>(k);
      if (computing[u]) {
        t_next = std::min(t_next, now + left[u] / v);
      } else if (next[u] < s.ranks[u].size()) {
        auto it = arrives.find(parallel::pp::message_tag(s, s.ranks[u][next[u]]));
        if (it != arrives.end()) t_next = std::min(t_next, it->second);
      }
    }
    if (!std::isfinite(t_next)) {
      std::string why;
      for (int k = 0; k < P; ++k) {
        const auto u = static_cast<size_t>(k);
        if (next[u] < s.ranks[u].size())
          why += fmt::format("; rank {} waits at action {} ({})", k, next[u],
                             parallel::pp::format_action(s.ranks[u][next[u]]));
      }
      fail_run("deadlock: no rank can progress{}", why);
    }
    const double dt = t_next - now;
    for (int k = 0; k < P; ++k) {
      const auto u = static_cast<size_t>(k);
      if (!computing[u]) continue;
      r.busy_s[u] += dt * v;
      // The action(s) that define the event end exactly now; the others lose dt·v of work.
      if (now + left[u] / v <= t_next) {
        computing[u] = false;
        if (keep_spans) r.spans[u].push_back({s.ranks[u][next[u]], start[u], t_next});
        ++next[u];
      } else {
        left[u] -= dt * v;
      }
    }
    now = t_next;
  }
  r.makespan_s = now;
  return r;
}

}  // namespace mt::plan

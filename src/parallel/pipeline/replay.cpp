#include "parallel/pipeline/replay.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "core/error.h"

namespace mt::parallel::pp {

CostFn unit_costs(double f, double b, double bi, double bw, double comm) {
  return [=](int, const Action& a) {
    switch (a.kind) {
      case ActionKind::kForward:
        return f;
      case ActionKind::kBackward:
        return b;
      case ActionKind::kBackwardInput:
        return bi;
      case ActionKind::kBackwardWeight:
        return bw;
      case ActionKind::kSendAct:
      case ActionKind::kSendGrad:
        return comm;
      default:
        return 0.0;
    }
  };
}

double Timeline::bubble_fraction() const {
  if (makespan <= 0 || ranks.empty()) return 0;
  double idle_sum = 0;
  for (double i : idle) idle_sum += i;
  return idle_sum / (static_cast<double>(ranks.size()) * makespan);
}

namespace {

// "; rank r waits at action i (x) for rank p" for every unfinished rank.
std::string waits(const Schedule& s, const std::vector<size_t>& next) {
  std::string why;
  for (int r = 0; r < s.pp; ++r) {
    if (next[r] >= s.ranks[r].size()) continue;
    const Action& a = s.ranks[r][next[r]];
    why += fmt::format("; rank {} waits at action {} ({}) for rank {}", r, next[r],
                       format_action(a), a.peer);
  }
  return why;
}

}  // namespace

Timeline replay(const Schedule& s, const CostFn& cost) {
  Timeline t;
  const int P = s.pp;
  t.ranks.resize(static_cast<size_t>(P));
  t.busy.assign(static_cast<size_t>(P), 0);
  std::vector<size_t> next(static_cast<size_t>(P), 0);
  std::vector<double> clock(static_cast<size_t>(P), 0);
  std::unordered_map<int, double> arrived;  // message tag -> arrival time
  size_t remaining = 0;
  for (const auto& l : s.ranks) remaining += l.size();
  while (remaining > 0) {
    bool progress = false;
    for (int r = 0; r < P; ++r) {
      const auto& list = s.ranks[r];
      while (next[r] < list.size()) {
        const Action& a = list[next[r]];
        double start = clock[r], end = clock[r];
        if (a.is_recv()) {
          auto it = arrived.find(message_tag(s, a));
          if (it == arrived.end()) break;  // blocks until the message arrives
          end = std::max(clock[r], it->second);
          start = end;
          arrived.erase(it);
        } else if (a.is_send()) {
          const int tag = message_tag(s, a);
          if (arrived.count(tag))
            fail_run("replay: rank {} sends {} twice (action {})", r, format_action(a), next[r]);
          arrived[tag] = clock[r] + cost(r, a);  // asynchronous: the rank goes on
        } else {
          end = start + cost(r, a);
          t.busy[r] += end - start;
        }
        t.ranks[r].push_back({static_cast<int>(next[r]), start, end});
        clock[r] = end;
        ++next[r];
        --remaining;
        progress = true;
      }
    }
    if (!progress) fail_run("deadlock: no rank can progress{}", waits(s, next));
  }
  for (int r = 0; r < P; ++r) t.makespan = std::max(t.makespan, clock[r]);
  for (int r = 0; r < P; ++r) t.idle.push_back(t.makespan - t.busy[r]);
  return t;
}

Timeline replay_rendezvous(const Schedule& s, const CostFn& cost) {
  Timeline t;
  const int P = s.pp;
  const auto n = static_cast<size_t>(P);
  t.ranks.resize(n);
  t.busy.assign(n, 0);
  std::vector<size_t> next(n, 0);
  std::vector<double> clock(n, 0);
  std::vector<bool> posted(n, false);  // the rank has posted the batch at next[r]
  // Message tag -> when its sender / receiver posted it, and the transfer time.
  std::unordered_map<int, double> send_posted, recv_posted, transfer;
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < P; ++r) {
      const auto& list = s.ranks[r];
      while (next[r] < list.size()) {
        if (list[next[r]].is_compute()) {
          const Action& a = list[next[r]];
          const double end = clock[r] + cost(r, a);
          t.ranks[r].push_back({static_cast<int>(next[r]), clock[r], end});
          t.busy[r] += end - clock[r];
          clock[r] = end;
          ++next[r];
          progress = true;
          continue;
        }
        size_t batch_end = next[r];
        while (batch_end < list.size() && !list[batch_end].is_compute()) ++batch_end;
        if (!posted[r]) {
          for (size_t i = next[r]; i < batch_end; ++i) {
            const Action& a = list[i];
            const int tag = message_tag(s, a);
            auto& side = a.is_send() ? send_posted : recv_posted;
            if (side.count(tag))
              fail_run("replay: rank {} posts {} twice (action {})", r, format_action(a), i);
            side[tag] = clock[r];
            if (a.is_send()) transfer[tag] = cost(r, a);
          }
          posted[r] = true;
          progress = true;
        }
        // The batch moves once every peer has posted its side; the rank's link carries its
        // sends one after another, and its receives likewise (full duplex: both at once).
        double start = clock[r], out = 0, in = 0;
        bool ready = true;
        for (size_t i = next[r]; i < batch_end && ready; ++i) {
          const int tag = message_tag(s, list[i]);
          auto sp = send_posted.find(tag), rp = recv_posted.find(tag);
          ready = sp != send_posted.end() && rp != recv_posted.end();
          if (!ready) break;
          start = std::max(start, std::max(sp->second, rp->second));
          (list[i].is_send() ? out : in) += transfer.at(tag);
        }
        if (!ready) break;
        const double end = start + std::max(out, in);
        for (size_t i = next[r]; i < batch_end; ++i)
          t.ranks[r].push_back({static_cast<int>(i), clock[r], end});
        clock[r] = end;
        next[r] = batch_end;
        posted[r] = false;
        progress = true;
      }
    }
  }
  for (int r = 0; r < P; ++r)
    if (next[r] < s.ranks[r].size()) fail_run("deadlock: no rank can progress{}", waits(s, next));
  for (int r = 0; r < P; ++r) t.makespan = std::max(t.makespan, clock[r]);
  for (int r = 0; r < P; ++r) t.idle.push_back(t.makespan - t.busy[r]);
  return t;
}

std::string format_timeline(const Schedule& s, const Timeline& t, double unit) {
  const int steps = static_cast<int>(std::ceil(t.makespan / unit - 1e-9));
  std::vector<std::vector<std::string>> cells(static_cast<size_t>(s.pp),
                                              std::vector<std::string>(steps, "."));
  size_t width = 6;
  for (int r = 0; r < s.pp; ++r)
    for (const Interval& iv : t.ranks[r]) {
      const Action& a = s.ranks[r][iv.action];
      if (!a.is_compute() || iv.end <= iv.start) continue;
      const std::string name = format_action(a);
      width = std::max(width, name.size());
      for (int k = static_cast<int>(std::floor(iv.start / unit + 1e-9));
           k < steps && k * unit < iv.end - 1e-9; ++k)
        cells[r][k] = name;
    }
  std::string out = fmt::format("{:<5}", "time");
  for (int r = 0; r < s.pp; ++r) out += fmt::format(" {:<{}}", fmt::format("rank {}", r), width);
  out += "\n";
  for (int k = 0; k < steps; ++k) {
    out += fmt::format("{:<5}", k);
    for (int r = 0; r < s.pp; ++r) out += fmt::format(" {:<{}}", cells[r][k], width);
    while (!out.empty() && out.back() == ' ') out.pop_back();
    out += "\n";
  }
  return out;
}

}  // namespace mt::parallel::pp

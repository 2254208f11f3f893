#include "plan/pipeline.h"

namespace mt::plan {

namespace pp = parallel::pp;

PipeSchedule make_schedule(const std::string& name, int P, int v, int m) {
  return pp::build_schedule(pp::parse_schedule_kind(name), P, m, v);
}

// Microbatch activation buffers a pipeline rank holds: the schedule's peak, plus the one
// the runtime's executor keeps for a receive posted while a released buffer's last send is
// in flight (src/train/pipeline_stage.cpp allocates peak + 1 before the first step).
std::vector<int> max_in_flight(const PipeSchedule& s) {
  std::vector<int> v = pp::peak_in_flight(s);
  if (s.pp > 1)
    for (int& x : v) x += 1;
  return v;
}

ReplayResult replay(const PipeSchedule& s,
                    const std::function<double(int, const PipeAction&)>& cost, double p2p_s,
                    bool keep_spans) {
  const pp::Timeline t = pp::replay(s, [&](int rank, const pp::Action& a) {
    if (a.is_compute()) return cost(rank, a);
    if (a.kind == PipeKind::kSendAct || a.kind == PipeKind::kSendGrad) return p2p_s;
    return 0.0;
  });
  ReplayResult r;
  r.makespan_s = t.makespan;
  r.busy_s = t.busy;
  if (keep_spans) {
    r.spans.resize(t.ranks.size());
    for (size_t k = 0; k < t.ranks.size(); ++k)
      for (const pp::Interval& iv : t.ranks[k]) {
        const PipeAction& a = s.ranks[k][static_cast<size_t>(iv.action)];
        if (a.is_compute()) r.spans[k].push_back({a, iv.start, iv.end});
      }
  }
  return r;
}

}  // namespace mt::plan

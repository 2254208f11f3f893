#include "cli/launch_layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/error.h"
#include "plan/hardware.h"
#include "plan/models.h"
#include "plan/planner.h"

namespace mt::cli::launch {

std::vector<Host> read_hostfile(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("--hostfile '{}' cannot be read (give a file of lines `HOST slots=N`)", path);
  std::vector<Host> hosts;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    line = line.substr(0, line.find('#'));
    std::istringstream words(line);
    Host h;
    if (!(words >> h.name)) continue;
    for (std::string w; words >> w;) {
      if (w.rfind("slots=", 0) != 0) continue;  // max_slots=, ...: Open MPI's, not ours
      const std::string v = w.substr(6);
      const bool digits = !v.empty() && v.size() < 6 && std::all_of(v.begin(), v.end(), [](char c) {
        return c >= '0' && c <= '9';
      });
      if (!digits || std::stoi(v) < 1)
        fail("--hostfile '{}' line {}: '{}' is not a slot count (write slots=N, N >= 1)", path,
             number, w);
      h.slots = std::stoi(v);
    }
    for (const Host& o : hosts)
      if (o.name == h.name)
        fail("--hostfile '{}' line {}: host '{}' is named twice (one line per host)", path, number,
             h.name);
    hosts.push_back(h);
  }
  if (hosts.empty())
    fail("--hostfile '{}' names no host (write one line `HOST slots=N` per host)", path);
  return hosts;
}

std::string hostfile_text(const std::vector<Host>& hosts) {
  std::string s;
  for (const Host& h : hosts) s += fmt::format("{} slots={}\n", h.name, h.slots);
  return s;
}

std::string Layout::text() const {
  return fmt::format("dp {} x tp {} x pp {}{}{}", dp, tp, pp,
                     cp > 1 ? fmt::format(" x cp {}", cp) : "",
                     ep > 1 ? fmt::format(" (ep {} of dp)", ep) : "");
}

namespace {

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int k = 1; k <= n; ++k)
    if (n % k == 0) d.push_back(k);
  return d;
}

// Whether the job runs in `l` (its batch divided by dp, its model by tp and pp, ...).
bool runs(const train::TrainOptions& job, const Layout& l) {
  train::TrainOptions o = job;
  o.dp = l.dp;
  o.tp = l.tp;
  o.pipeline.pp = l.pp;
  o.cp = l.cp;
  o.ep = l.ep;
  try {
    o.validate();
  } catch (const Error&) {
    return false;
  }
  return true;
}

// The largest dp for tp x pp (and `cap`'s cp and ep) within `ranks` ranks (0: none; dp a
// multiple of ep, which validate checks).
int largest_dp(const train::TrainOptions& job, const Layout& cap, int tp, int pp, int ranks) {
  for (int dp = ranks / (tp * pp * cap.cp); dp >= 1; --dp)
    if (job.batch % dp == 0 && runs(job, {dp, tp, pp, cap.cp, cap.ep})) return dp;
  return 0;
}

}  // namespace

std::optional<Choice> choose_layout(const train::TrainOptions& job, const Layout& cap, int slots,
                                    const StepTimeModel& model) {
  const int ranks = std::min(slots, cap.ranks());
  // dp shrinks first: tp and pp as the first layout had them.
  if (const int dp = largest_dp(job, cap, cap.tp, cap.pp, ranks); dp > 0)
    return Choice{{dp, cap.tp, cap.pp, cap.cp, cap.ep}, "dp shrinks first"};
  // Then the model-parallel sizes: every tp' | tp and pp' | pp with their largest dp; those
  // using the most ranks are ranked by the planner.
  std::vector<Layout> best;
  for (int tp : divisors(cap.tp))
    for (int pp : divisors(cap.pp)) {
      const int dp = largest_dp(job, cap, tp, pp, ranks);
      if (dp == 0) continue;
      const Layout l{dp, tp, pp, cap.cp, cap.ep};
      if (!best.empty() && l.ranks() < best[0].ranks()) continue;
      if (!best.empty() && l.ranks() > best[0].ranks()) best.clear();
      best.push_back(l);
    }
  if (best.empty()) return std::nullopt;
  // Without a prediction, the larger tp (kept inside a host), then the larger pp.
  std::stable_sort(best.begin(), best.end(), [](const Layout& a, const Layout& b) {
    return a.tp != b.tp ? a.tp > b.tp : a.pp > b.pp;
  });
  if (best.size() == 1 || !model) {
    return Choice{best[0], best.size() == 1
                               ? "tp x pp shrinks: no dp fits tp x pp as they were"
                               : fmt::format("{} layouts of {} ranks fit; no planner model: the "
                                             "larger tp",
                                             best.size(), best[0].ranks())};
  }
  std::vector<std::pair<double, Layout>> ranked;
  std::string listed;
  for (const Layout& l : best) {
    const std::optional<double> t = model(l);
    ranked.emplace_back(t ? *t : std::numeric_limits<double>::infinity(), l);
    listed += fmt::format("{}{} {}", listed.empty() ? "" : ", ", l.text(),
                          t ? fmt::format("{:.3g} s/step", *t) : std::string("(not modelled)"));
  }
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  return Choice{ranked[0].second, fmt::format("the planner ranks {} layouts of {} ranks: {}",
                                              best.size(), best[0].ranks(), listed)};
}

AfterGrowSignal after_grow_signal(int exit_code, int64_t last_step, int64_t steps) {
  if (last_step >= steps) return AfterGrowSignal::kDone;
  return exit_code == 3 ? AfterGrowSignal::kGrow : AfterGrowSignal::kFailed;
}

StepTimeModel planner_step_time(const train::TrainOptions& job, const std::string& cluster,
                                std::string* why) {
  plan::ClusterSpec spec;
  try {
    spec = plan::cluster_preset(cluster);
  } catch (const Error& e) {
    if (why) *why = e.what();
    return {};
  }
  return [job, spec](const Layout& l) -> std::optional<double> {
    plan::Job j;
    j.model = plan::from_gpt(job.model);
    j.cluster = spec;
    j.gpus = l.ranks();
    j.batch = job.batch;
    j.seq = job.model.seq_len;
    j.dtype = job.dtype == "bf16" ? "bf16" : "f32";
    j.our_runtime = true;
    plan::Layout p;
    p.dp = l.dp;
    p.tp = l.tp;
    p.pp = l.pp;
    p.cp = l.cp;
    p.ep = l.ep;
    p.sp = job.sp;
    p.zero = job.zero;
    p.schedule = l.pp > 1 ? job.pipeline.schedule : "1f1b";
    try {
      train::TrainOptions o = job;
      o.dp = l.dp;
      o.tp = l.tp;
      o.pipeline.pp = l.pp;
      o.cp = l.cp;
      o.ep = l.ep;
      p.microbatch = o.microbatch_size();
      p.recompute = plan::parse_recompute(job.recompute);
      p = plan::as_run(j, p);
      if (plan::invalid_reason(j, p)) return std::nullopt;
      return plan::estimate(j, p).step_time_s;
    } catch (const Error&) {
      return std::nullopt;
    }
  };
}

}  // namespace mt::cli::launch

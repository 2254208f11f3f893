// The layout search (`plan`): every (tp, pp, dp, cp, ep, expert tp, v, microbatch, ZeRO,
// recomputation, SP) the job allows, refused with the reason or estimated with the step
// model (step_model.h), the replay skipped where a lower bound is already slower than the
// k-th best.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>

#include "core/error.h"
#include "plan/moe.h"
#include "plan/planner.h"
#include "plan/step_model.h"

namespace mt::plan {

using namespace step_model;

namespace {
// Faster first; within 0.01% the simpler layout (lower ZeRO stage, less recomputation, no SP,
// fewer pipeline stages).
bool better(const Estimate& a, const Estimate& b) {
  if (std::abs(a.step_time_s - b.step_time_s) > 1e-4 * std::min(a.step_time_s, b.step_time_s))
    return a.step_time_s < b.step_time_s;
  const auto& x = a.layout;
  const auto& y = b.layout;
  return std::tuple(x.zero, int(x.recompute), x.sp, x.pp, x.virtual_stages) <
         std::tuple(y.zero, int(y.recompute), y.sp, y.pp, y.virtual_stages);
}
// Every microbatch size that divides a replica's share of the batch (1 alone where dp does
// not divide the batch: invalid_reason then says so).
std::vector<int64_t> microbatch_sizes(int64_t batch, int dp) {
  if (batch % dp != 0) return {1};
  const int64_t per_replica = batch / dp;
  std::vector<int64_t> low, high;  // divisors up to and beyond the square root
  for (int64_t b = 1; b * b <= per_replica; ++b)
    if (per_replica % b == 0) {
      low.push_back(b);
      if (b * b != per_replica) high.push_back(per_replica / b);
    }
  low.insert(low.end(), high.rbegin(), high.rend());
  return low;
}

}  // namespace

SearchResult search(const Job& job, const SearchPins& pins, int top_k) {
  const auto t0 = std::chrono::steady_clock::now();
  Job j = job;
  j.cluster = job.cluster.for_job(job.gpus);
  SearchResult res;
  const ModelSpec& m = j.model;
  auto note = [&](const std::string& reason, const std::string& example) {
    if (res.dropped[reason]++ == 0) res.example[reason] = example;
  };
  std::vector<int> tps, pps;
  // T within a node (Narayanan et al.): every tp that keeps its groups inside one.
  for (int t = 1; t <= std::min<int64_t>(j.cluster.gpus_per_node, j.gpus); ++t)
    if (tp_fits_nodes(j, t)) tps.push_back(t);
  // Stages: every count that divides the GPUs and leaves each stage a layer (our partition
  // splits any n_layer >= pp, unevenly where it must); Megatron-LM 2021 needed pp | n_layer.
  for (int64_t p = 1; p <= std::min(m.n_layer, j.gpus); ++p)
    if (j.gpus % p == 0 && (!pins.megatron_2021 || m.n_layer % p == 0)) pps.push_back(int(p));
  if (pins.tp) tps = {*pins.tp};
  if (pins.pp) pps = {*pins.pp};
  const int cp = pins.cp.value_or(1);
  std::vector<Recompute> rcs = {Recompute::kNone, Recompute::kSelective, Recompute::kFull};
  // Selective recomputation is Korthikanti et al. 2022's, after Megatron-LM 2021.
  if (pins.megatron_2021) rcs = {Recompute::kNone, Recompute::kFull};
  if (pins.recompute) rcs = {*pins.recompute};
  const double hbm = j.cluster.gpu.hbm_bytes;

  struct Cand {
    Layout l;
    Prepared p;
    MemoryBytes mem;
    int worst = 0, flight = 0;
    double lb = 0;
  };
  std::vector<Cand> cands;
  std::map<std::tuple<std::string, int, int, int64_t>, std::pair<std::vector<int>, ChunkFlight>>
      flights;
  double best_oom_over = std::numeric_limits<double>::infinity();
  for (int t : tps)
    for (int pp : pps) {
      const int64_t tpc = int64_t(t) * pp * cp;
      // A (tp, pp) that does not divide the GPUs has no dp to enumerate the rest over: it
      // counts as one layout considered and dropped.
      if (j.gpus % tpc != 0) {
        ++res.considered;
        note("gpus not divisible by tp x pp x cp",
             fmt::format("tp {} pp {}: {} % {} != 0", t, pp, j.gpus, tpc));
        continue;
      }
      const int dp = static_cast<int>(j.gpus / tpc);
      if (pins.dp && *pins.dp != dp) {
        ++res.considered;
        note("tp x pp x cp leaves another dp than --dp",
             fmt::format("tp {} pp {} gives dp {}, not --dp {}", t, pp, dp, *pins.dp));
        continue;
      }
      // Virtual stages: those that split the layers evenly; beyond Megatron-LM 2021 also
      // uneven ones (our partition takes any n_layer >= pp·v and balances the chunks by
      // cost, as chunk_layers predicts), so that e.g. 126 layers can interleave over 16
      // stages.
      std::vector<int> vs = {1};
      if (pp > 1)
        for (int v = 2; v <= 16 && int64_t(pp) * v <= m.n_layer; ++v)
          if (m.n_layer % (int64_t(pp) * v) == 0 || (!pins.megatron_2021 && v <= 8))
            vs.push_back(v);
      if (pins.megatron_2021 && pp <= 2) vs = {1};
      if (pins.schedule && *pins.schedule != "interleaved") vs = {1};  // only it interleaves
      if (pins.virtual_stages) vs = {*pins.virtual_stages};
      std::vector<int64_t> mbss = microbatch_sizes(j.batch, dp);
      if (pins.microbatch) mbss = {*pins.microbatch};
      std::vector<int> zeros = {0, 1, 2, 3};
      if (pins.megatron_2021) zeros = {0};
      if (pins.zero) zeros = {*pins.zero};
      std::vector<bool> sps = {false, true};
      if (pins.megatron_2021) sps = {false};
      if (pins.sp) sps = {*pins.sp};
      std::vector<int> eps = ep_choices(j, dp, cp);
      if (pins.ep) eps = {*pins.ep};
      // Megatron-Core's MoE under tp: the experts split over tp (its default) or whole.
      std::vector<int> etps = {0};
      if (m.is_moe() && !runs_our_runtime(j) && t > 1) etps = {0, 1};
      if (pins.etp) etps = {*pins.etp};
      for (int ep : eps)
        for (int etp : etps)
          for (int v : vs)
            for (int64_t mbs : mbss)
              for (int z : zeros)
                for (Recompute rc : rcs)
                  for (bool sp : sps) {
                    Layout l;
                    l.dp = dp;
                    l.tp = t;
                    l.pp = pp;
                    l.cp = cp;
                    l.ep = ep;
                    l.etp = etp;
                    l.cp_comm = pins.cp_comm;
                    l.virtual_stages = v;
                    l.microbatch = mbs;
                    l.zero = z;
                    l.recompute = rc;
                    l.sp = sp;
                    set_software(l, pins.megatron_2021);
                    l.dp_overlap = pins.dp_overlap.value_or(l.dp_overlap);
                    l.tp_overlap = pins.tp_overlap.value_or(l.tp_overlap);
                    l.tp_comm_overlap = pins.tp_comm_overlap && sp;
                    l.fused_attention = pins.fused_attention.value_or(l.fused_attention);
                    l.grad_accum_fusion = pins.grad_accum_fusion.value_or(l.grad_accum_fusion);
                    l.pp_layers = pins.pp_layers;
                    l.tp_across_nodes = pins.tp_across_nodes;
                    l.schedule = pins.schedule.value_or(v > 1 ? "interleaved" : "1f1b");
                    l = as_run(j, l);
                    ++res.considered;
                    std::string kind;
                    std::optional<std::string> why = invalid_reason(j, l, &kind);
                    // Valid, but a layout the search has already (ZeRO over one rank is stage 0)
                    // or one that Megatron-LM 2021 could not run (a pinned --virtual-stages).
                    if (!why && dp * cp == 1 && z > 0) {
                      kind = "ZeRO over a single data-parallel rank (no ZeRO's layout again)";
                      why = fmt::format("tp {} pp {} dp {} cp {} zero {}: nothing to shard over", t,
                                        pp, dp, cp, z);
                    }
                    if (!why && pins.megatron_2021 && v > 1 && pp <= 2) {
                      kind = "Megatron-LM 2021 interleaves only with pp > 2";
                      why = fmt::format("pp {} virtual stages {}", pp, v);
                    }
                    if (why) {
                      note(kind.empty() ? *why : kind, *why);
                      continue;
                    }
                    Cand c;
                    c.l = l;
                    const int64_t nmb = j.batch / (int64_t(dp) * mbs);
                    auto key = std::make_tuple(l.schedule, pp, v, nmb);
                    auto it = flights.find(key);
                    if (it == flights.end()) {
                      const PipeSchedule sched = make_schedule(l.schedule, pp, v, int(nmb));
                      it = flights
                               .emplace(key, std::make_pair(max_in_flight(sched, spare_set(j)),
                                                            spare_set(j) ? ChunkFlight{}
                                                                         : chunk_flight(sched)))
                               .first;
                    }
                    c.mem = memory_with_flight(j, l, it->second.first, &c.worst, &c.flight,
                                               &it->second.second);
                    if (c.mem.total() > hbm) {
                      const double over = c.mem.total() - hbm;
                      best_oom_over = std::min(best_oom_over, over);
                      note("out of memory",
                           fmt::format(
                               "tp {} pp {} dp {} mb {} zero {} recompute {}{}: {:.1f} GB over", t,
                               pp, dp, mbs, z, recompute_name(rc), sp ? " sp" : "", over / 1e9));
                      continue;
                    }
                    ++res.fit;
                    c.p = prepare(j, l);
                    c.lb = lower_bound(j, c.p, l);
                    cands.push_back(std::move(c));
                  }
    }
  if (res.dropped.count("out of memory"))
    res.example["out of memory"] +=
        fmt::format(" (closest layout: {:.2f} GB over)", best_oom_over / 1e9);
  std::sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& b) { return a.lb < b.lb; });
  std::vector<Estimate> best;
  for (const Cand& c : cands) {
    if (static_cast<int>(best.size()) >= top_k && c.lb > best.back().step_time_s * (1 + 1e-4))
      break;
    Estimate e;
    e.layout = c.l;
    e.memory = c.mem;
    e.worst_stage = c.worst;
    e.in_flight = c.flight;
    e.microbatches = c.p.microbatches;
    e.replay = replay_layout(j, c.l, c.p, false);
    ++res.replayed;
    finish(j, c.p, e);
    best.push_back(std::move(e));
    std::sort(best.begin(), best.end(), better);
    if (static_cast<int>(best.size()) > top_k) best.pop_back();
  }
  res.top = std::move(best);
  res.search_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace mt::plan

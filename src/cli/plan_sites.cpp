#include "cli/plan_sites.h"

#include "core/error.h"
#include "obs/metrics.h"
#include "plan/sites.h"
#include "plan/sites_memory.h"

namespace mt::cli {

void PlanSitesFlags::add_to(CLI::App& app) {
  app.add_option("--sites", sites,
                 "also model the best layout across S sites joined by a slow link: step time "
                 "synchronous and with DiLoCo, and the H from which the link stops being the "
                 "bottleneck (docs/diloco.md)");
  app.add_option("--outer-every", every,
                 "--sites: DiLoCo's inner steps per outer step (default 50)");
  app.add_option("--outer-compress", compress,
                 "--sites: the outer exchange as none (f32), bf16 or int8 (default none)");
  app.add_option("--site-gbps", gbps,
                 "--sites: the link between sites, Gbit/s each way (default: the cluster's "
                 "site_bytes_per_s)");
  app.add_option("--site-latency-ms", latency_ms,
                 "--sites: the link's latency per message in ms (default: the cluster's "
                 "site_latency_s)");
}

void PlanSitesFlags::report(const plan::Job& j, const plan::Estimate& best, FILE* human,
                            nlohmann::json* json) const {
  if (!sites) {
    if (gbps || latency_ms || every != 50 || compress != "none")
      fail("--outer-every, --outer-compress, --site-gbps and --site-latency-ms need --sites S");
    return;
  }
  const double rate = gbps ? *gbps * 1e9 / 8 : j.cluster.site_bytes_per_s;
  const double latency = latency_ms ? *latency_ms / 1e3 : j.cluster.site_latency_s;
  if (best.layout.dp % *sites != 0)
    fail("--sites {} does not divide the best layout's dp {}: pin --dp to a multiple of {}", *sites,
         best.layout.dp, *sites);
  // Gradients as the planner reduces them (plan/planner.cpp gradient_bytes): fp16 in fp16,
  // bf16 and f32 in f32.
  const double grad_bytes = j.dtype == "fp16" ? 2 : 4;
  const plan::SitesEstimate e =
      plan::estimate_sites(best.step_time_s, j.model.total_params(), grad_bytes,
                           plan::outer_bytes_per_value(compress), *sites, every, rate, latency);
  std::fprintf(human, "%s", plan::sites_text(e, rate, latency).c_str());
  // A rank's memory with DiLoCo (plan/sites_memory.h): its site's model states (ZeRO within
  // the site) and the outer state of its shard, Nesterov's (DiLoCo's); the worst stage.
  const plan::Layout& l = best.layout;
  double memory_bytes = -1, outer_bytes = -1;
  if ((l.dp / *sites) % l.ep == 0) {
    plan::OuterMemory om;
    om.sites = *sites;
    om.compress = compress;
    std::vector<plan::MemoryBytes> outer;
    const std::vector<plan::MemoryBytes> stages = plan::memory_by_stage_in_sites(j, l, om, &outer);
    for (size_t r = 0; r < stages.size(); ++r)
      if (stages[r].total() > memory_bytes) {
        memory_bytes = stages[r].total();
        outer_bytes = outer[r].total();
      }
    std::fprintf(human,
                 "  with DiLoCo a rank holds %s (its site's model states, ZeRO within the "
                 "site, and %s of outer state: the f32 outer parameters and momentum of its "
                 "shard, the exchange buffer)\n",
                 obs::human_bytes(memory_bytes).c_str(), obs::human_bytes(outer_bytes).c_str());
  }
  if (json)
    (*json)["sites"] = {{"sites", e.sites},
                        {"memory_bytes", memory_bytes},
                        {"outer_state_bytes", outer_bytes},
                        {"every", e.every},
                        {"site_bytes_per_s", rate},
                        {"site_latency_s", latency},
                        {"inside_s", e.inside_s},
                        {"sync_exchange_s", e.sync_exchange_s},
                        {"outer_exchange_s", e.outer_exchange_s},
                        {"sync_step_s", e.sync_step_s},
                        {"diloco_step_s", e.diloco_step_s},
                        {"every_unbound", e.every_unbound}};
}

}  // namespace mt::cli

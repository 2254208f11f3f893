#include "plan/sites.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace mt::plan {

double site_exchange_s(double params, double bytes_per_value, int sites, double bytes_per_s,
                       double latency_s) {
  const double s = sites;
  return 2 * (s - 1) / s * params * bytes_per_value / bytes_per_s + 2 * (s - 1) * latency_s;
}

double outer_bytes_per_value(const std::string& compress) {
  if (compress == "none") return 4;
  if (compress == "bf16") return 2;
  if (compress == "int8") return 1 + 4.0 / 128;
  fail("--outer-compress '{}' is not an encoding (choose none, bf16 or int8)", compress);
}

SitesEstimate estimate_sites(double inside_s, double params, double gradient_bytes,
                             double outer_bytes, int sites, int64_t every, double bytes_per_s,
                             double latency_s) {
  if (sites < 2) fail("--sites {} must be at least 2 to put a link between sites", sites);
  if (every < 1) fail("--outer-every {} must be at least 1", every);
  if (!(bytes_per_s > 0))
    fail(
        "the link between sites has no rate ({} bytes/s): give the cluster a site_bytes_per_s, "
        "or --site-gbps",
        bytes_per_s);
  if (!(latency_s >= 0)) fail("the link's latency {} s must be at least 0", latency_s);
  if (!(inside_s > 0)) fail("the step time inside a site {} s must be positive", inside_s);
  SitesEstimate e;
  e.sites = sites;
  e.every = every;
  e.params = params;
  e.gradient_bytes = gradient_bytes;
  e.outer_bytes = outer_bytes;
  e.inside_s = inside_s;
  e.sync_exchange_s = site_exchange_s(params, gradient_bytes, sites, bytes_per_s, latency_s);
  e.outer_exchange_s = site_exchange_s(params, outer_bytes, sites, bytes_per_s, latency_s);
  e.sync_step_s = inside_s + e.sync_exchange_s;
  e.diloco_step_s = inside_s + e.outer_exchange_s / static_cast<double>(every);
  e.every_unbound =
      std::max<int64_t>(1, static_cast<int64_t>(std::ceil(e.outer_exchange_s / inside_s)));
  return e;
}

std::string sites_text(const SitesEstimate& e, double bytes_per_s, double latency_s) {
  return fmt::format(
      "across {} sites (link {:.4g} Gbit/s, {:.4g} ms; docs/diloco.md): synchronous dp "
      "{:.4f} s/step ({:.4f} inside + {:.4f} gradient exchange); DiLoCo with H = {} "
      "{:.4f} s/step ({:.4f} outer exchange every {} steps, {:.1f}x faster); the link stops "
      "being the bottleneck from H = {}\n",
      e.sites, bytes_per_s * 8 / 1e9, latency_s * 1e3, e.sync_step_s, e.inside_s, e.sync_exchange_s,
      e.every, e.diloco_step_s, e.outer_exchange_s, e.every, e.sync_step_s / e.diloco_step_s,
      e.every_unbound);
}

}  // namespace mt::plan

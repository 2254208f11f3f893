// The planner's model of training across sites joined by a slow link (docs/diloco.md, "The
// planner"): the job's dp dimension split into S sites, each on its own cluster, the sites
// joined by one link per site of `site_bytes_per_s` each way and `site_latency_s` per
// message (ClusterSpec's site fields). Whatever the layout inside a site, one exchange
// between sites moves the whole model once through every site's link: a ring all-reduce of
// P values of b bytes over the S sites sends 2 (S - 1) / S x P b bytes through each site's
// link in 2 (S - 1) latency-bound hops:
//
//   exchange(b) = 2 (S - 1) / S x P b / rate + 2 (S - 1) x latency
//
//   synchronous dp across the sites:  step = inside + exchange(gradient bytes)   (every step)
//   DiLoCo, outer step every H:       step = inside + exchange(outer bytes) / H  (amortised)
//   the link stops being the bottleneck from H* = ceil(exchange(outer bytes) / inside): the
//   smallest H whose amortised exchange fits in one inner step, so that an exchange
//   overlapped with the inner steps (streaming) is hidden.
//
// `inside` is the planner's step time of the job as if its GPUs were one cluster: a site runs
// the same per-rank work (dp / S ranks on B / S sequences). Not overlapped with compute in
// the synchronous case (the inter-site link is far slower than the in-site dp reduction the
// planner already overlaps).
#pragma once

#include <cstdint>
#include <string>

namespace mt::plan {

struct SitesEstimate {
  int sites = 1;
  int64_t every = 1;            // H
  double params = 0;            // P: the model's parameters
  double gradient_bytes = 4;    // b of the synchronous gradient exchange
  double outer_bytes = 4;       // b of the outer exchange (4 f32, 2 bf16, 1 + 4/128 int8)
  double inside_s = 0;          // the step inside a site
  double sync_exchange_s = 0;   // exchange(gradient bytes)
  double outer_exchange_s = 0;  // exchange(outer bytes)
  double sync_step_s = 0;       // inside + sync exchange
  double diloco_step_s = 0;     // inside + outer exchange / H
  int64_t every_unbound = 1;    // H*
};

// One exchange of `params` values of `bytes_per_value` bytes over `sites` sites.
double site_exchange_s(double params, double bytes_per_value, int sites, double bytes_per_s,
                       double latency_s);

// Refuses (exit 2) sites < 2, every < 1, a rate <= 0 or a negative latency, naming the fix.
SitesEstimate estimate_sites(double inside_s, double params, double gradient_bytes,
                             double outer_bytes, int sites, int64_t every, double bytes_per_s,
                             double latency_s);

// Bytes per value of train's --outer-compress none | bf16 | int8 (an f32 scale per 128).
double outer_bytes_per_value(const std::string& compress);

std::string sites_text(const SitesEstimate& e, double bytes_per_s, double latency_s);

}  // namespace mt::plan

#include "plan/sites_memory.h"

#include <algorithm>
#include <cmath>

#include "plan/moe.h"
#include "plan/stages.h"

namespace mt::plan {

MemoryBytes outer_state_bytes(double n, const OuterMemory& o, double dense, int ep) {
  n = std::max(n, 1.0);  // the runtime's tensors hold at least one element
  MemoryBytes mb;
  mb.optimizer = 4 * n * (o.momentum ? 2 : 1);
  // With ep the dense elements are packed after the rank's experts, padded to E slices, and
  // only the rank's slice is sent (the rest gathered inside the site).
  const double E = ep, slices = ep > 1 ? E * std::ceil(dense / E) : 0;
  const double m = ep > 1 ? n - dense + slices : n;  // packed (an upper bound for F > 1)
  const double sent = ep > 1 ? n - dense + slices / E : n;
  if (o.compress == "none") {
    mb.communication = 4 * m;
  } else {
    const double S = o.sites, c = std::ceil(std::ceil(sent / S) / 128) * 128;
    const double w = o.compress == "bf16" ? c / 2 : c / 128 + c / 4;
    mb.communication = 4 * (std::max(S * c, m) + 2 * S * w + c);
  }
  mb.communication += 4 * slices;  // the gathered slices
  if (o.delay) mb.communication += 4 * m;
  return mb;
}

std::vector<MemoryBytes> memory_by_stage_in_sites(const Job& job, const Layout& layout,
                                                  const OuterMemory& o,
                                                  std::vector<MemoryBytes>* outer) {
  // One site: dp / S ranks on B / S sequences, the same microbatches per rank.
  Job j = job;
  Layout l = layout;
  l.dp = layout.dp / o.sites;
  j.batch = job.batch / o.sites;
  j.gpus = job.gpus / o.sites;
  std::vector<MemoryBytes> stages = memory_by_stage(j, l);
  const Split split = split_of(j, l);
  const double group = double(l.dp) * l.cp / l.ep;  // the site's (expert-)dp x cp ranks
  if (outer) outer->clear();
  for (int r = 0; r < l.pp; ++r) {
    // The stage's parameters per tp rank, its own experts only with ep (memory.cpp's psi_r).
    // With ep its dense part: all but the experts of its layers (n_experts / ep of each).
    const double psi = stage_params(j, l, split, r);
    const double experts = split.rank[size_t(r)] * expert_params_per_layer(j, l);
    const MemoryBytes add =
        outer_state_bytes(psi / group, o, l.ep > 1 ? (psi - experts) / group : 0, l.ep);
    stages[size_t(r)].optimizer += add.optimizer;
    stages[size_t(r)].communication += add.communication;
    if (outer) outer->push_back(add);
  }
  return stages;
}

}  // namespace mt::plan

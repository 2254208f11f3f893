#include "plan/moe.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace mt::plan {

Job compute_view(const Job& j, const Layout& l) {
  Job c = j;
  if (!j.model.is_moe()) return c;
  // Imbalance shows only where experts live on different ranks: on one rank the grouped
  // GEMM does the same rows however they are spread over its experts.
  const double load = l.ep > 1 ? j.expert_load : 1.0;
  c.model.d_ff = std::max<int64_t>(1, std::llround(j.model.active_ff(load)));
  c.model.n_experts = c.model.moe_layers = 0;
  return c;
}

int ep_per_node(const Job& j, const Layout& l) {
  const int64_t stride = int64_t(l.cp) * l.tp;
  const int64_t fit = std::max<int64_t>(1, j.cluster.gpus_per_node / stride);
  return int(std::min<int64_t>(fit, l.ep));
}

double ep_all_to_all_s(const Job& j, const Layout& l, double bytes) {
  if (l.ep <= 1 || bytes <= 0) return 0;
  const ClusterSpec& c = j.cluster;
  const double ep = l.ep, in_node = ep_per_node(j, l);
  const double intra = bytes * (in_node - 1) / ep / c.intra_bytes_per_s;
  const double inter = bytes * (ep - in_node) / ep / c.inter_bytes_per_s;
  const double lat = (in_node - 1) * c.intra_latency_s + (ep - in_node) * c.inter_latency_s;
  return std::max(intra, inter) + lat;
}

EpCosts ep_costs(const Job& j, const Layout& l) {
  EpCosts e;
  const ModelSpec& m = j.model;
  if (!m.is_moe() || l.ep <= 1) return e;
  const double tokens = double(j.seq) / l.cp * double(l.microbatch) / l.tp;
  const double wb = j.dtype == "f32" ? 4 : 2;
  // The busiest rank receives expert_load times the mean.
  const double bytes = tokens * double(m.top_k) * double(m.d_model) * wb * j.expert_load;
  const double one = ep_all_to_all_s(j, l, bytes);
  const double share = double(m.moe_layers) / double(m.n_layer);
  e.fwd = 2 * one * share;  // dispatch + combine
  e.bwd = 2 * one * share;  // their gradients, the other way
  return e;
}

std::optional<std::pair<std::string, std::string>> ep_invalid(const Job& j, const Layout& l) {
  const ModelSpec& m = j.model;
  if (l.ep < 1) return std::pair{"ep below 1", fmt::format("ep {} must be at least 1", l.ep)};
  if (l.ep == 1) return std::nullopt;
  if (!m.is_moe())
    return std::pair{
        "ep on a dense model",
        fmt::format("ep {}: model {} has no experts to split (drop --ep)", l.ep, m.name)};
  if ((int64_t(l.dp) * l.cp) % l.ep != 0)
    return std::pair{"ep does not divide dp x cp",
                     fmt::format("ep {} does not divide dp {} x cp {} (expert parallelism is "
                                 "carved from the data-parallel ranks)",
                                 l.ep, l.dp, l.cp)};
  if (m.n_experts % l.ep != 0)
    return std::pair{"ep does not divide n_experts",
                     fmt::format("ep {} does not divide the {} experts", l.ep, m.n_experts)};
  return std::nullopt;
}

MemoryBytes ep_model_states(double psi, double expert_psi, const Layout& l,
                            const std::string& dtype) {
  const int dpn = l.dp * l.cp;
  const MemoryBytes d = zero_model_states(psi - expert_psi, dpn, l.zero, dtype);
  const MemoryBytes e = zero_model_states(expert_psi, std::max(1, dpn / l.ep), l.zero, dtype);
  MemoryBytes mb;
  mb.parameters = d.parameters + e.parameters;
  mb.gradients = d.gradients + e.gradients;
  mb.optimizer = d.optimizer + e.optimizer;
  return mb;
}

std::vector<int> ep_choices(const Job& j, int dp, int cp) {
  if (!j.model.is_moe()) return {1};
  std::vector<int> out;
  const int64_t n = int64_t(dp) * cp;
  for (int64_t e = 1; e <= n && e <= j.model.n_experts; ++e)
    if (n % e == 0 && j.model.n_experts % e == 0) out.push_back(int(e));
  return out;
}

}  // namespace mt::plan

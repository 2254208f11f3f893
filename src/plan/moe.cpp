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
  const double load = compute_load(j, l);
  c.model.d_ff = std::max<int64_t>(1, std::llround(j.model.active_ff(load)));
  c.model.n_experts = c.model.moe_layers = 0;
  return c;
}

double compute_load(const Job& j, const Layout& l) {
  if (l.ep <= 1) return 1.0;
  return 1.0 + (j.expert_load - 1.0) * per_rank_share(j) / rank_cap(j);
}

int moe_expert_tp(const Job& j, const Layout& l) {
  if (!j.model.is_moe() || runs_our_runtime(j)) return 1;
  return l.etp > 0 ? l.etp : l.tp;
}

int expert_dp(const Job& j, const Layout& l) {
  const int whole_over = l.tp / moe_expert_tp(j, l);  // tp ranks holding the same experts
  const int ranks = runs_our_runtime(j) ? l.dp * l.cp : whole_over * l.dp * l.cp;
  return std::max(1, ranks / l.ep);
}

double expert_params_per_layer(const Job& j, const Layout& l) {
  return j.model.block_expert_params() / (double(l.ep) * moe_expert_tp(j, l));
}

int ep_per_node(const Job& j, const Layout& l) {
  const int64_t stride = runs_our_runtime(j) ? int64_t(l.cp) * l.tp : moe_expert_tp(j, l);
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
  // Megatron-Core runs MoE on sequence-parallel shards under tp; every tp rank of our
  // runtime routes and exchanges all the microbatch's tokens (docs/moe.md, "Layouts").
  const double tokens =
      double(j.seq) / l.cp * double(l.microbatch) / (runs_our_runtime(j) ? 1 : l.tp);
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
  if (l.etp != 0 && l.etp != 1 && l.etp != l.tp)
    return std::pair{"etp neither 1 nor tp",
                     fmt::format("etp {}: the experts are split over all the tp ranks ({}) or "
                                 "none (1)",
                                 l.etp, l.tp)};
  if (l.etp != 0 && !m.is_moe())
    return std::pair{
        "etp on a dense model",
        fmt::format("etp {}: model {} has no experts to split (drop --etp)", l.etp, m.name)};
  if (l.etp > 1 && runs_our_runtime(j))
    return std::pair{"etp above 1 in our runtime",
                     fmt::format("etp {}: our runtime keeps the experts whole on every tp rank "
                                 "(drop --etp)",
                                 l.etp)};
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
  if (runs_our_runtime(j) && l.dp % l.ep != 0)
    return std::pair{"ep does not divide dp",
                     fmt::format("ep {} does not divide dp {} (train carves ep from the "
                                 "data-parallel ranks only; use --ep dividing --dp)",
                                 l.ep, l.dp)};
  if (m.n_experts % l.ep != 0)
    return std::pair{"ep does not divide n_experts",
                     fmt::format("ep {} does not divide the {} experts", l.ep, m.n_experts)};
  return std::nullopt;
}

MemoryBytes ep_model_states(double psi, double expert_psi, const Job& j, const Layout& l) {
  const int dpn = l.dp * l.cp;
  const int dense_dp = runs_our_runtime(j) ? std::max(1, dpn / l.ep) : dpn;
  const MemoryBytes d = zero_model_states(psi - expert_psi, dense_dp, l.zero, j.dtype);
  const MemoryBytes e = zero_model_states(expert_psi, expert_dp(j, l), l.zero, j.dtype);
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

OurMoeBytes our_moe_bytes(const Job& j, const Layout& l) {
  const ModelSpec& m = j.model;
  OurMoeBytes o;
  if (!m.is_moe()) return o;
  const double n = double(j.seq) / l.cp * double(l.microbatch), C = double(m.d_model);
  const double E = double(m.n_experts), k = double(m.top_k), ep = l.ep;
  const double Fe = double(m.d_ff_expert), FCe = m.swiglu ? 2 * Fe : Fe;
  const double Fs = double(m.d_ff_shared), FCs = m.swiglu ? 2 * Fs : Fs;
  const double R = ep > 1 ? ep * n * std::min(k, E / ep) : n * k;  // expert-buffer rows
  // Kept (floats or i32, 4 bytes each): probs [n, E], lse [n], gate, expert, slot [n, k],
  // order [n·k], h [R, FC], act [R, F], ys [n·k, C]; ep: xe [R, C]; the shared expert's
  // h [n, FCs] and act [n, Fs].
  o.block = 4 * (n * E + n + 4 * n * k + R * (FCe + Fe) + n * k * C + (ep > 1 ? R * C : 0.0) +
                 n * (FCs + Fs));
  // Scratch: logits [n, E], xs and dys [n·k, C], dact [R, F], dh [R, FC], dgate [n, k],
  // y [n, C]; ep: xr and ye [R, C]; the shared expert's dact and dh.
  o.scratch = 4 * (n * E + 2 * n * k * C + R * (Fe + FCe) + n * k + n * C +
                   (ep > 1 ? 2 * R * C : 0.0) + n * (Fs + FCs));
  return o;
}

double our_ep_pack_bytes(const Layout& l, double psi, double dense_params) {
  if (l.ep <= 1) return 0;
  const double shard = l.zero >= 1 ? psi / std::max(1, l.dp * l.cp / l.ep) : psi;
  return 4 * std::min(dense_params, shard);
}

}  // namespace mt::plan

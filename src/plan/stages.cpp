#include "plan/stages.h"

#include <algorithm>

#include "plan/moe.h"

namespace mt::plan {

Split split_of(const Job& j, const Layout& l) {
  Split s;
  s.chunk = chunk_layers(j, l);
  s.rank.assign(size_t(l.pp), 0);
  s.rank_max.assign(size_t(l.pp), 0);
  for (size_t c = 0; c < s.chunk.size(); ++c) {
    const size_t r = c % size_t(l.pp);
    s.rank[r] += s.chunk[c];
    s.rank_max[r] = std::max(s.rank_max[r], s.chunk[c]);
  }
  s.busiest = *std::max_element(s.rank.begin(), s.rank.end());
  return s;
}

// Parameters of pipeline chunk c (model order; before ZeRO), per TP rank.
double chunk_params(const Job& j, const Layout& l, const Split& split, int c) {
  const ModelSpec& m = j.model;
  double p = split.chunk[size_t(c)] *
             m.block_params_per_tp(l.tp, l.ep, runs_our_runtime(j), moe_expert_tp(j, l));
  if (c == 0) p += m.embedding_params_per_tp(l.tp);
  if (c == int(split.chunk.size()) - 1) {
    p += m.head_params_per_tp(l.tp);
    // The tied embedding's copy that Megatron (and our runtime) keeps on the last stage.
    if (m.tied && l.pp > 1) p += double(m.vocab) * m.d_model / l.tp;
  }
  return p;
}

// Parameters held by pipeline rank r (before ZeRO), per TP rank: its chunks r, r + pp, ...
double stage_params(const Job& j, const Layout& l, const Split& split, int r) {
  double p = 0;
  for (size_t c = size_t(r); c < split.chunk.size(); c += size_t(l.pp))
    p += chunk_params(j, l, split, int(c));
  return p;
}

Z3Modules z3_modules(const Job& j, const Layout& l) {
  const ModelSpec& m = j.model;
  const double h = double(m.d_model), t = double(l.tp), ff = double(m.d_ff);
  Z3Modules z;
  const double params[4] = {h * (h + 2 * double(m.kv_dim())) / t, h * h / t,
                            double(m.mlp_mats() - 1) * h * ff / t, h * ff / t};
  double later = 0;  // the parameters of the modules after this one
  for (int i = 3; i >= 0; --i) {
    z.params[i] = params[i];
    z.regathered[i] = l.z3_max_reuse_distance > 0 && 2 * later >= l.z3_max_reuse_distance;
    later += params[i];
  }
  return z;
}

double regathered_fraction(const Job& j, const Layout& l) {
  const Z3Modules z = z3_modules(j, l);
  double total = 0, regathered = 0;
  for (int i = 0; i < 4; ++i) {
    total += z.params[i];
    if (z.regathered[i]) regathered += z.params[i];
  }
  return regathered / total;
}

// A tp group is tp consecutive ranks: inside one node when tp divides a node's GPUs, or
// when the whole job is one node.
bool tp_fits_nodes(const Job& j, int tp) {
  return j.cluster.gpus_per_node % tp == 0 || j.gpus <= j.cluster.gpus_per_node;
}

}  // namespace mt::plan

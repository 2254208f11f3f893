#include "plan/explain.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "plan/kernels.h"

namespace mt::plan {

std::vector<StepItem> explain(const Job& job, const Estimate& e) {
  Job j = job;
  j.cluster = job.cluster.for_job(job.gpus);
  const Layout& l = e.layout;  // as run
  const LayerKernels k = layer_kernels(j, l, per_rank_share(j));
  // The busiest rank's layers: chunks r, r + P, r + 2P, ... of the pp·v chunks.
  const std::vector<int> chunks = chunk_layers(j, l);
  const int r = e.busiest_rank, P = l.pp;
  double layers = 0;
  for (size_t c = size_t(r); c < chunks.size(); c += size_t(P)) layers += chunks[c];
  const bool first = r == 0, last = (int(chunks.size()) - 1) % P == r;
  const double m = double(e.microbatches), lm = m * layers;
  const bool full = l.recompute == Recompute::kFull;
  const bool core_again = full || l.recompute == Recompute::kSelective;
  // Forward once, backward twice (input and weight gradients), full recomputation once more.
  const double gemm_passes = 3 + (full ? 1 : 0);
  std::vector<StepItem> items = {
      {"GEMM: QKV", lm * k.qkv * gemm_passes},
      {"GEMM: attention output projection", lm * k.proj * gemm_passes},
      {"GEMM: MLP in", lm * k.mlp_in * gemm_passes},
      {"GEMM: MLP out", lm * k.mlp_out * gemm_passes},
      {"attention (scores, softmax · V)",
       lm * (k.attention + k.attention_bwd + (core_again ? k.attention : 0.0))},
      {"memory-bound: norms, residual adds", lm * k.norm_residual * gemm_passes},
      {"memory-bound: activation", lm * k.activation * gemm_passes},
      {"memory-bound: softmax (unfused)", lm * k.softmax * (3 + (core_again ? 1 : 0))},
      {"memory-bound: MoE token permute, combine", lm * k.moe_copy * gemm_passes},
      {"per-pass overhead", lm * k.overhead * (2 + (full ? 1 : 0))},
      {"LM head GEMM + cross-entropy",
       last ? m * (3 * k.head + k.cross_entropy + k.cross_entropy_bwd) : 0.0},
      {"embedding", first ? m * 2 * k.embedding : 0.0},
      {"TP communication (exposed)", e.tp_comm_s},
      {"TP vocabulary-parallel collectives", e.tp_vocab_s},
      {"CP ring communication (exposed)", e.cp_comm_s},
      {"EP all-to-all (dispatch, combine)", e.ep_comm_s},
      {"MoE expert-TP gather, scatter", e.moe_tp_comm_s},
      {"gradient accumulation (unfused)", e.grad_accum_s},
  };
  const double busy = e.forward_s + e.backward_s;
  double listed = 0;
  for (const StepItem& it : items) listed += it.seconds;
  // What the busiest rank's actions hold beyond the kernels above: ZeRO-3's gathers where
  // they outlast the compute they overlap; on a shared host the pipeline's sends, copies by
  // the rank's own cores; else nothing (rounding).
  const char* rest = l.zero >= 3                   ? "ZeRO-3 gathers beyond compute"
                     : j.cluster.compute_units > 0 ? "p2p copies by the cores (shared host)"
                                                   : "other";
  items.push_back({rest, busy - listed});
  items.push_back({"pipeline bubble + blocking p2p", e.pipeline_s - busy});
  items.push_back({"tied embedding sync", e.embedding_sync_s});
  items.push_back({"DP gradient reduction (exposed)", e.dp_exposed_s});
  items.push_back({"optimizer step", e.optimizer_s});
  return items;
}

std::string explain_text(const std::vector<StepItem>& items, double step_time_s) {
  std::string out;
  double sum = 0;
  for (const StepItem& it : items) {
    sum += it.seconds;
    if (std::abs(it.seconds) < 1e-4 * step_time_s) continue;
    const double frac = it.seconds / step_time_s;
    const int bar = std::clamp(int(std::lround(frac * 40)), 0, 40);
    out += fmt::format("  {:<36} {:>10.4f} s {:>6.1f}%  {}\n", it.name, it.seconds, 100 * frac,
                       std::string(size_t(bar), '#'));
  }
  out +=
      fmt::format("  {:<36} {:>10.4f} s (the items sum to {:.4f} s)\n", "step", step_time_s, sum);
  return out;
}

}  // namespace mt::plan

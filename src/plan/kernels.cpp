#include "plan/kernels.h"

#include <algorithm>

#include "plan/moe.h"

namespace mt::plan {

namespace {

// An MoE block's MLP GEMMs, forward, as the rank runs them (docs/planner.md "Mixture of
// experts"): the router [n, C] × [C, E]; each of its E/ep experts as its own GEMM pair on its
// share of the tokens, ep·n·k/E rows (times the busiest expert's load where ep > 1); the
// shared expert on every token. Megatron-Core routes the sequence-parallel shard (n/t
// tokens), splits every expert over the expert-tp group (moe_expert_tp: tp) whose routed rows
// it gathers first, and splits the shared expert over tp; our runtime routes all n tokens on
// every tp rank and keeps the experts whole. `gemm(M, N, K)` costs one GEMM without a launch
// floor (a grouped GEMM is one kernel).
template <class Gemm>
std::pair<double, double> moe_gemms(const Job& j, const Layout& l, double n, Gemm gemm) {
  const ModelSpec& m = j.model;
  const bool ours = runs_our_runtime(j);
  const double t = l.tp, nm = ours ? n : n / t, C = double(m.d_model), E = double(m.n_experts);
  const double k = double(m.top_k), ep = l.ep, load = compute_load(j, l);
  const double et = moe_expert_tp(j, l);
  const double Fe = double(m.d_ff_expert) / et, Fs = double(m.d_ff_shared);
  const double mats = m.swiglu ? 2 : 1;
  const double rows = std::max(1.0, et * ep * nm * k / E * load), local = E / ep;
  double in = gemm(nm, E, C) + local * gemm(rows, mats * Fe, C);
  double out = local * gemm(rows, C, Fe);
  if (Fs > 0) {
    const double split = ours ? 1 : t, tokens = ours ? nm : n;
    in += gemm(tokens, mats * Fs / split, C);
    out += gemm(tokens, C, Fs / split);
  }
  return {in, out};
}

}  // namespace

LayerKernels layer_kernels(const Job& job, const Layout& l, double share) {
  // The dense view of an MoE model (the width a token's MLP passes through) for the
  // memory-bound activation; the MLP GEMMs below take the blocks as they are.
  const Job j = compute_view(job, l);
  const ModelSpec& m = j.model;
  const ModelSpec& mo = job.model;
  const GpuSpec& g = j.cluster.gpu;
  const bool mixed = j.dtype != "f32";
  const bool ours = runs_our_runtime(j);
  const double peak = g.peak_flops(j.dtype) * share;
  const double hbm = g.hbm_bytes_per_s * g.hbm_efficiency * share;
  // A shared host (compute_units > 0) runs its kernels as calls on the cores: no launch.
  const double launch = j.cluster.compute_units > 0 ? 0.0 : g.kernel_launch_s;
  // s tokens per rank (seq / cp); their queries attend over all S = seq keys, with CP as
  // cp blocks of s keys that the ring brings in turn.
  const double t = l.tp, s = double(j.seq) / l.cp, S = double(j.seq), b = double(l.microbatch),
               n = s * b, cp = l.cp;
  const double h = m.d_model, F = m.d_ff, kv = m.kv_dim(), a = m.n_head, hd = m.head_dim();
  // One kernel of `batch` GEMMs [M, K] × [K, N] (batched over heads for attention), at the
  // curve's rate for its shape, and never shorter than a launch.
  auto gemm = [&](double M, double N, double K, double batch) {
    return std::max(launch, 2 * M * N * K * batch / (peak * g.gemm_efficiency(M, N, K, j.dtype)));
  };
  // With userbuffers each GEMM beside a TP collective runs as t chunks of n / t rows.
  const bool ub = l.tp_comm_overlap && l.tp > 1 && j.cluster.compute_units == 0;
  const double rows = ub ? n / t : n, chunks = ub ? t : 1;
  LayerKernels k;
  k.qkv = chunks * gemm(rows, (h + 2 * kv) / t, h, 1);
  k.proj = chunks * gemm(rows, h, h / t, 1);
  k.mlp_in = chunks * gemm(rows, (m.swiglu ? 2 : 1) * F / t, h, 1);
  k.mlp_out = chunks * gemm(rows, h, F / t, 1);
  if (mo.is_moe()) {
    // Averaged over the blocks: the dense ones' MLP (of mo.d_ff), the MoE ones' GEMMs by shape.
    const double moe = double(mo.moe_layers) / double(mo.n_layer), Fd = double(mo.d_ff);
    auto raw = [&](double M, double N, double K) {
      return 2 * M * N * K / (peak * g.gemm_efficiency(M, N, K, j.dtype));
    };
    const auto [in, out] = moe_gemms(job, l, n, raw);
    k.mlp_in = (1 - moe) * chunks * gemm(rows, (m.swiglu ? 2 : 1) * Fd / t, h, 1) +
               moe * std::max(launch, in);
    k.mlp_out = (1 - moe) * chunks * gemm(rows, h, Fd / t, 1) + moe * std::max(launch, out);
    // Token copies, bytes forward: gathering the routed rows in expert order (read + write
    // n·k rows of C), combining them (read n·k, write n), and with ep or expert tp the
    // regrouping of what arrives (after the all-to-all and the expert-tp all-gather) and
    // what returns (twice, read + write, the rows received: n·k·load, times expert tp).
    const double nm = runs_our_runtime(job) ? n : n / t, kk = double(mo.top_k);
    const double et = moe_expert_tp(job, l);
    const double recv = l.ep > 1 || et > 1 ? et * nm * kk * compute_load(job, l) : 0.0;
    const double bytes = (2 * nm * kk + nm * kk + nm + 4 * recv) * h * (mixed ? 2 : 4);
    k.moe_copy = moe * std::max(launch, bytes / hbm);
  }
  const bool fused = mixed && l.fused_attention && !ours;
  if (fused && !g.attention.empty()) {
    // A fused causal kernel: half the T×T FLOPs at the table's rate for the whole sequence,
    // scaled to this head dimension as the GEMM curve scales its inner dimension.
    const AttentionRates& r = g.attention;
    const double hd_scale = (1 + g.gemm.d0 / r.head_dim) / (1 + g.gemm.d0 / hd);
    const double flops = 4 * b * (a / t) * s * S * hd / 2;
    const double sustain = g.compute_sustain * hd_scale * share;
    const double fwd_rate = AttentionRates::at(r.seq, r.fwd_flops_per_s, S) * sustain;
    const double bwd_rate = AttentionRates::at(r.seq, r.bwd_flops_per_s, S) * sustain;
    k.attention = std::max(launch, flops / fwd_rate);
    k.attention_bwd = std::max(launch, 2.5 * flops / bwd_rate);
  } else {
    // Scores (full T×T) and probabilities · V, per key block, batched over the rank's heads.
    k.attention = cp * (gemm(s, s, hd, b * a / t) + gemm(s, hd, s, b * a / t));
    k.attention_bwd = 2 * k.attention;
    if (ours && runs_our_flash(j, l)) {
      // Our blockwise kernel (kernels/flash_attention.h): GEMMs on blocks of br query rows x
      // bc keys, batched over the block pairs a rank computes. The causal mask skips the
      // blocks above the diagonal: query block i of a whole sequence sees about
      // (i + 1)·br/bc key blocks, (s/br)·(S/bc + 1)/2 pairs in all, and under cp's
      // load-balanced split every rank 1/cp of them (parallel/context.h). Backward
      // recomputes the probabilities: five GEMMs per block pair against forward's two.
      const double br = std::min(s, double(kOurFlashQueryBlock));
      const double bc = std::min(S, double(kOurFlashKeyBlock));
      const double pairs = b * a / t * (s / br) * (S / bc + 1) / 2;
      k.attention = gemm(br, bc, hd, pairs) + gemm(br, hd, bc, pairs);
      k.attention_bwd = 2.5 * k.attention;
      if (!g.attention.empty()) {
        // Calibrated on this host (calibrate: the kernel itself, its in-block softmax
        // included): a rank's causal share of the T×T FLOPs at the rate of the kernel on
        // calls as long as the rank's: the whole sequence without cp and under a2a (Ulysses
        // gathers the sequence for 1/cp of the heads), else the pieces of the load-balanced
        // split (parallel/context.h: 2·cp chunks of S/2cp; the ring and the all-gather call
        // the kernel on those). Scaled to this head dimension as the GEMM curve scales its
        // inner dimension.
        const AttentionRates& r = g.attention;
        const double hd_scale = (1 + g.gemm.d0 / r.head_dim) / (1 + g.gemm.d0 / hd);
        const double flops = 4 * b * (a / t) * s * S * hd / 2;
        const double rate = hd_scale * share;
        const double call = l.cp == 1 || l.cp_comm == "a2a" ? S : s / 2;
        k.attention =
            std::max(launch, flops / (AttentionRates::at(r.seq, r.fwd_flops_per_s, call) * rate));
        k.attention_bwd = std::max(
            launch, 2.5 * flops / (AttentionRates::at(r.seq, r.bwd_flops_per_s, call) * rate));
      }
    }
  }
  // Memory-bound kernels (bytes per token, docs/planner.md): layer norms and residual
  // (dropout-)adds (4 kernels), the activation function, the softmax over the attention
  // scores (+ dropout). Our runtime has no dropout; its bias adds move those bytes (as
  // measured in f32).
  const double wb = mixed ? 2 : 4;
  const bool drop = m.dropout && !ours;
  const double rep = (drop || (ours && m.bias) ? 22.0 : 16.0) * h * wb / 2;
  const double act = (m.swiglu ? 6.0 : 4.0) * F * wb / 2;
  // Softmax over the T×T scores: unfused, mixed precision reads the scores and writes the
  // probabilities (+ dropout's mask and output); f32 is our runtime; fused: none.
  double soft = 16.0 * a * S;
  if (mixed) soft = l.fused_attention ? 0.0 : (drop ? 9.0 : 4.0) * a * S;
  if (ours && runs_our_flash(j, l)) soft = 0.0;  // inside the blockwise kernel, per block
  k.norm_residual = std::max(4 * launch, n * (l.sp ? rep / t : rep) / hbm);
  k.activation = std::max(launch, n * act / t / hbm);
  if (mo.is_moe()) {
    // The activation over the rows each block runs: a dense block's n·F/t; an MoE block's
    // routed rows (the tokens it routes times k, times the load with ep) of the experts' width,
    // and the shared expert (split over tp by Megatron-Core, whole in ours).
    const double per = (m.swiglu ? 6.0 : 4.0) * wb / 2,
                 share_moe = double(mo.moe_layers) / mo.n_layer;
    const double nm = ours ? n : n / t, load = compute_load(job, l);
    const double moe_elems = nm * double(mo.top_k) * load * double(mo.d_ff_expert) +
                             n * double(mo.d_ff_shared) / (ours ? 1 : t);
    const double dense_elems = n * double(mo.d_ff) / t;
    k.activation =
        std::max(launch, ((1 - share_moe) * dense_elems + share_moe * moe_elems) * per / hbm);
  }
  k.softmax = soft > 0 ? std::max(launch, n * soft / t / hbm) : 0.0;
  k.overhead = g.kernel_overhead_s;
  // LM head (vocab-parallel) and cross-entropy in f32 over the logits; the embedding lookup.
  // Bytes per logit, read + written (docs/planner.md, "Memory-bound kernels"): our runtime
  // 12 each way; mixed precision as Megatron runs it over its bf16 logits, forward: the f32
  // copy (2 + 4) with its maximum (unfused a pass of its own, 4), the shift, exp and sum
  // (fused one pass, 4 + 4; unfused 8 + 8 + 4) and the normalisation into the softmax kept
  // for backward (8); backward: the softmax scaled in place by the loss's gradient (8) and
  // cast to bf16 for the head's GEMMs (4 + 2).
  const double V = m.vocab, logits = n * V / t;
  const double ce_fwd = !mixed || ours ? 12.0 : (l.fused_cross_entropy ? 22.0 : 38.0);
  const double ce_bwd = !mixed || ours ? 12.0 : 14.0;
  k.head = gemm(n, V / t, h, 1);
  k.cross_entropy = std::max(launch, logits * ce_fwd / hbm);
  k.cross_entropy_bwd = std::max(launch, logits * ce_bwd / hbm);
  k.embedding = std::max(launch, n * h * wb * 2 / hbm);
  return k;
}

}  // namespace mt::plan

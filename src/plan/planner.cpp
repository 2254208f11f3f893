#include "plan/planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <tuple>

#include "core/error.h"
#include "parallel/pipeline/partition.h"
#include "plan/kernels.h"
#include "plan/moe.h"
#include "plan/stages.h"
#include "plan/step_model.h"

namespace mt::plan {

namespace {

// --- collectives: alpha-beta ring on a hierarchy -------------------------------------

double ring_time(double bytes, int n, double factor, double bw, double lat) {
  if (n <= 1 || bytes <= 0) return 0;
  return factor * (n - 1) / n * bytes / bw + factor * (n - 1) * lat;
}

struct Link {
  double bw, lat;
};

}  // namespace

double rank_cap(const Job& j) {
  const int64_t cores = j.cluster.compute_units;
  if (cores <= 0) return 1.0;
  return double(std::max<int64_t>(1, cores / j.gpus)) / double(cores);
}

double per_rank_share(const Job& j) {
  if (j.cluster.compute_units <= 0) return 1.0;
  return std::min(1.0 / static_cast<double>(j.gpus), rank_cap(j));
}

using step_model::PassCosts;

namespace {

// The step between nodes of a hierarchical collective: α-β, or where calibrate measured the
// link by size (ClusterSpec::inter_curve) the all-reduce's time at that size, scaled by the
// α-β ratio to this collective's factor and node count (exact at the measured ones), never
// below α-β: the curve adds what α-β misses (a rendezvous round trip), but a message timed
// alone can beat the sustained rate a step's messages in a row get (a shaper's burst let a
// 256 KiB all-reduce through at line rate at 100 Mbit/s, and the test that tp across such
// hosts costs more than inside them failed in CI).
double inter_node_time(const ClusterSpec& c, double bytes, int nodes, double factor) {
  const double ab = ring_time(bytes, nodes, factor, c.inter_bytes_per_s, c.inter_latency_s);
  const LinkCurve& k = c.inter_curve;
  if (k.empty() || ab <= 0) return ab;
  const double ref = ring_time(bytes, k.ranks, 2, c.inter_bytes_per_s, c.inter_latency_s);
  return std::max(ab, k.at(bytes) * ab / ref);
}

// All-reduce (factor 2) or all-gather / reduce-scatter (factor 1) of `bytes` over n ranks,
// `per_node` of which share a node.
double hier_collective(const Job& j, double bytes, int n, int per_node, double factor) {
  const ClusterSpec& c = j.cluster;
  if (n <= 1) return 0;
  per_node = std::clamp(per_node, 1, n);
  if (per_node >= n) return ring_time(bytes, n, factor, c.intra_bytes_per_s, c.intra_latency_s);
  const int nodes = (n + per_node - 1) / per_node;  // a partly filled last node is a node too
  double t = 0;
  if (per_node > 1) {
    // reduce-scatter in the node, the inter-node step on 1/per_node, all-gather in the node
    t += 2 * ring_time(bytes, per_node, factor / 2, c.intra_bytes_per_s, c.intra_latency_s);
  }
  t += inter_node_time(c, bytes / per_node, nodes, factor);
  return t;
}

PassCosts pass_costs(const Job& j, const Layout& l) {
  const ModelSpec& m = j.model;
  const double t = l.tp, s = double(j.seq) / l.cp, b = double(l.microbatch), n = s * b, cp = l.cp;
  const double h = m.d_model, kv = m.kv_dim();
  const LayerKernels k = layer_kernels(j, l, per_rank_share(j));
  const double qkv = k.qkv, mlp_in = k.mlp_in, proj = k.proj, mlp_out = k.mlp_out;
  const double att_block = k.attention / cp;  // one CP key block's attention, forward
  const double wb = weight_bytes(j);
  const double fwd_compute = k.fwd();
  const double bwd_compute = k.bwd();
  // Userbuffers (the GEMMs in `k` are then chunked, see layer_kernels).
  const bool ub = l.tp_comm_overlap && l.tp > 1 && j.cluster.compute_units == 0;
  // TP: two all-reduces (or all-gather + reduce-scatter with SP) per layer and pass.
  const double act_bytes = n * h * wb;
  // One collective over the tp group: inside a node, or with tp across nodes (dp x cp fill a
  // node first: tp's ranks are dp·cp apart, per_node of them share a node).
  auto tp_collective = [&](double bytes, double factor) {
    if (l.tp <= 1) return 0.0;
    if (l.tp_across_nodes) {
      const int per_node = std::max(1, j.cluster.gpus_per_node / (l.dp * l.cp));
      return hier_collective(j, bytes, l.tp, per_node, factor);
    }
    return ring_time(bytes, l.tp, factor, j.cluster.intra_bytes_per_s, j.cluster.intra_latency_s);
  };
  const double tp_one = l.sp ? 2 * tp_collective(act_bytes, 1) : tp_collective(act_bytes, 2);
  // Megatron-Core's MoE blocks split their experts over tp (plan/moe.h moe_expert_tp): their
  // MLP has no sequence-parallel gather and scatter of the tokens; the dispatcher gathers the
  // routed rows (k per token, the busiest rank's load) over tp instead, and reduce-scatters
  // the experts' outputs, forward and (the other way) backward, beside no GEMM.
  // With expert tp 1 (Layout::etp) the experts are whole and the rows need no gather: none.
  const double et = moe_expert_tp(j, l);
  const bool mcore_moe = m.is_moe() && !runs_our_runtime(j);
  const double moe_share = mcore_moe ? double(m.moe_layers) / double(m.n_layer) : 0.0;
  const double mlp_sp = 1 - moe_share;  // the blocks whose MLP has SP's collectives
  PassCosts pc;
  if (et > 1) {
    const double load = l.ep > 1 ? j.expert_load : 1.0;
    const double routed = double(m.top_k) * load * act_bytes;
    pc.moe_tp_fwd = pc.moe_tp_bwd = moe_share * 2 * tp_collective(routed, 1);
  }
  pc.tp_fwd = (1 + mlp_sp) * tp_one;
  // Backward's two belong to the column-parallel linears (their input gradients); overlapped,
  // each shows only beyond its linear's weight-gradient GEMM (the forward GEMM's FLOPs). On a
  // shared host the cores that would compute do the copies: nothing overlaps.
  // Zero-bubble schedules run the weight gradients later, apart from the input gradients
  // whose collectives would hide behind them: no overlap there either.
  const bool overlap = l.tp_overlap && j.cluster.compute_units == 0 && l.schedule != "zb1";
  pc.tp_bwd = overlap ? std::max(0.0, tp_one - qkv) + mlp_sp * std::max(0.0, tp_one - mlp_in)
                      : (1 + mlp_sp) * tp_one;
  if (ub) {
    // Userbuffers: each of SP's four collectives per pass (half of tp_one) is chunked with
    // the GEMM beside it. An all-gather (before qkv and MLP in) shows only beyond its GEMM:
    // chunk i computes while chunk i + 1 arrives. A reduce-scatter (after the projection
    // and MLP out) sends each chunk's partial sums as it is done, so the last chunk's
    // transfer follows the GEMM whatever its size. Backward: the same pairs with the
    // input-gradient GEMMs of those shapes.
    const double one = tp_one / 2;
    const double exposed =
        std::max(0.0, one - qkv) + std::max(one / t, one - proj) +
        mlp_sp * (std::max(0.0, one - mlp_in) + std::max(one / t, one - mlp_out));
    pc.tp_fwd = pc.tp_bwd = exposed;
  }
  if (l.cp > 1) {
    // CP ranks follow TP in the rank order: inside a node while tp·cp fits, else the
    // exchange crosses nodes. kv_bytes: a rank's K and V (its TP rank's kv heads), one block.
    const bool intra = int64_t(l.tp) * l.cp <= j.cluster.gpus_per_node;
    const double bw = intra ? j.cluster.intra_bytes_per_s : j.cluster.inter_bytes_per_s;
    const double lat = intra ? j.cluster.intra_latency_s : j.cluster.inter_latency_s;
    const double kv_bytes = 2 * n * kv / t * wb;
    if (l.cp_comm == "all-gather") {
      // Llama 3: per layer an all-gather of the cp blocks (each rank receives cp − 1);
      // backward gathers them again and reduce-scatters dK|dV. Collectives that wait for
      // every rank, not overlapped with the attention.
      const double one = ring_time(cp * kv_bytes, l.cp, 1, bw, lat);
      pc.cp_fwd = one;
      pc.cp_bwd = 2 * one;
    } else if (l.cp_comm == "a2a") {
      // Ulysses: an all-to-all moves (cp − 1)/cp of what a rank sends, in cp − 1 steps.
      // Forward: q|k|v of the rank's tokens (its TP rank's a + 2·kv heads) out, the outputs
      // (a heads) back; backward: q|k|v, the outputs and their gradients out, dq|dk|dv back
      // (docs/context_parallel.md's bytes). Not overlapped.
      const double hdb = n * m.head_dim() / t * wb;  // one head's rows of this rank, bytes
      const double a = double(m.n_head), kvh = double(m.n_kv_head);
      auto a2a = [&](double bytes) { return (cp - 1) / cp * bytes / bw + (cp - 1) * lat; };
      pc.cp_fwd = a2a(hdb * (a + 2 * kvh)) + a2a(hdb * a);
      pc.cp_bwd = a2a(hdb * (a + 2 * kvh)) + 2 * a2a(hdb * a) + a2a(hdb * (a + 2 * kvh));
    } else {
      // Ring attention: cp − 1 times each rank passes the K and V of its tokens to the next
      // CP rank while it computes on the block it holds; backward passes K, V and their
      // gradients against the backward compute (bench/cp: on the local backend too).
      pc.cp_fwd = (cp - 1) * std::max(0.0, lat + kv_bytes / bw - att_block);
      pc.cp_bwd = (cp - 1) * std::max(0.0, lat + 2 * kv_bytes / bw - k.attention_bwd / cp);
    }
  }
  const EpCosts ep = ep_costs(j, l);
  pc.ep_fwd = ep.fwd;
  pc.ep_bwd = ep.bwd;
  pc.fwd = fwd_compute + pc.tp_fwd + pc.cp_fwd + pc.ep_fwd + pc.moe_tp_fwd;
  double bwd = bwd_compute + pc.tp_bwd + pc.cp_bwd + pc.ep_bwd + pc.moe_tp_bwd;
  pc.bwd_plain = bwd;
  if (l.recompute == Recompute::kFull) {
    bwd += fwd_compute + pc.tp_fwd + pc.cp_fwd + pc.ep_fwd + pc.moe_tp_fwd;
    pc.tp_bwd += pc.tp_fwd;
    pc.cp_bwd += pc.cp_fwd;
    pc.ep_bwd += pc.ep_fwd;
    pc.moe_tp_bwd += pc.moe_tp_fwd;
  } else if (l.recompute == Recompute::kSelective) {
    bwd += k.attention + k.softmax + pc.cp_fwd;  // the attention core again (the ring with CP)
    pc.cp_bwd += pc.cp_fwd;
  }
  pc.bwd = bwd;
  pc.head_fwd = k.head + k.cross_entropy;
  pc.head_bwd = 2 * k.head + k.cross_entropy_bwd;
  pc.embed_fwd = k.embedding;
  pc.embed_bwd = k.embedding;
  if (l.tp > 1) {
    // Vocabulary parallelism (Megatron-LM's VocabParallelEmbedding and parallel
    // cross-entropy, our parallel/tp): the embedding's output is summed over tp (SP: a
    // reduce-scatter); the LM head's input gradient likewise, its input all-gathered first
    // with SP; the cross-entropy all-reduces three numbers per token (the logits' maximum,
    // the target's logit, the sum of exponentials): three all-reduces in Megatron-LM, two in
    // ours (the maximum, then the other two together). None hides behind a GEMM.
    const double vocab_one = l.sp ? tp_collective(act_bytes, 1) : tp_collective(act_bytes, 2);
    const double per_token = runs_our_runtime(j)
                                 ? tp_collective(n * 4.0, 2) + tp_collective(2 * n * 4.0, 2)
                                 : 3 * tp_collective(n * 4.0, 2);
    pc.embed_fwd += vocab_one;
    pc.head_fwd += per_token + (l.sp ? tp_collective(act_bytes, 1) : 0);
    pc.head_bwd += vocab_one;
    pc.vocab_first = vocab_one;
    pc.vocab_last = per_token + (l.sp ? tp_collective(act_bytes, 1) : 0) + vocab_one;
  }
  return pc;
}

}  // namespace

std::string recompute_name(Recompute r) {
  switch (r) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
  }
  return "?";
}

Recompute parse_recompute(const std::string& s) {
  if (s == "none" || s == "off") return Recompute::kNone;
  if (s == "selective") return Recompute::kSelective;
  if (s == "full") return Recompute::kFull;
  fail("unknown --recompute '{}' (choose none, selective or full)", s);
}

bool runs_our_runtime(const Job& j) {
  return !mixed(j) || j.our_runtime || j.cluster.compute_units > 0;
}

bool runs_our_flash(const Job& j, const Layout& l) {
  if (!runs_our_runtime(j)) return false;
  if (l.cp > 1) return true;  // context parallelism runs the blockwise kernel on its pieces
  return j.cluster.compute_units > 0 && l.fused_attention && j.seq >= kOurCpuFlashMinSeq;
}

Layout as_run(const Job& j, Layout l) {
  if (l.pp == 1 && l.schedule != "interleaved") l.schedule = "1f1b";
  // A shared host's collectives and sends are copies by the cores that compute: nothing
  // overlaps there. Our runtime runs attention unfused and its TP collectives and pipeline
  // exchanges blocking (parallel/tp.cpp; the batched exchanges on NCCL); its DP reduction
  // overlaps the last backward.
  const bool gpus = j.cluster.compute_units == 0, ours = runs_our_runtime(j);
  l.dp_overlap = l.dp_overlap && gpus;
  l.tp_overlap = l.tp_overlap && gpus && !ours && l.tp > 1 && l.schedule != "zb1";
  l.tp_comm_overlap = l.tp_comm_overlap && gpus && !ours && l.tp > 1;
  l.pp_overlap = l.pp_overlap && gpus && !ours && l.pp > 1 && l.schedule == "interleaved";
  // Ours: the blockwise CPU kernel where train's --attention auto picks it (runs_our_flash).
  l.fused_attention = ours ? runs_our_flash(j, l) : l.fused_attention;
  return l;
}

void set_software(Layout& l, Software s) {
  const bool deepspeed = s == Software::kDeepSpeed2021;
  if (deepspeed) s = Software::kMegatron2021;
  l.z3_bytes_per_s = deepspeed ? kDeepSpeed2021Zero3BytesPerS : 0.0;
  l.z3_max_reuse_distance = deepspeed ? kDeepSpeed2021MaxReuseDistance : 0.0;
  l.z3_module_prefetch = deepspeed;
  const bool today = s == Software::kToday;
  // 2021/2022: torch DDP's overlapped reduction only without pipelining (DDP=local else).
  l.dp_overlap = today || l.pp == 1;
  l.tp_overlap = s != Software::kMegatron2021;
  l.pp_overlap = today;
  l.fused_attention = today;
  l.fused_cross_entropy = today;
  l.fused_swiglu = today;
  l.grad_accum_fusion = s != Software::kMegatron2021;
  l.torch_ddp = !today && l.pp == 1;
  l.even_layers = !today;
}

std::vector<int> chunk_layers(const Job& j, const Layout& l) {
  const int chunks = l.pp * l.virtual_stages;
  const int L = static_cast<int>(j.model.n_layer);
  if (!l.pp_layers.empty()) {  // invalid_reason says what is wrong with it; this guards indexing
    if (static_cast<int>(l.pp_layers.size()) != chunks)
      fail("--pp-layers has {} entries but pp {} x virtual stages {} = {} chunks",
           l.pp_layers.size(), l.pp, l.virtual_stages, chunks);
    return l.pp_layers;
  }
  if (chunks <= 1) return {L};
  if (l.even_layers) {  // the remainder, where it does not divide, on the first chunks
    std::vector<int> out(size_t(chunks), L / chunks);
    for (int c = 0; c < L % chunks; ++c) ++out[size_t(c)];
    return out;
  }
  // The runtime's balanced split, once per shape: the search asks for it per layout.
  using Key = std::tuple<int, int64_t, int64_t, int64_t, int>;
  static std::mutex mu;
  static std::map<Key, std::vector<int>> cache;
  const Key key{L, j.model.d_model, j.seq, j.model.vocab, chunks};
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it == cache.end()) {
    const auto k = parallel::pp::gpt_chunk_costs(L, double(j.model.d_model), double(j.seq),
                                                 double(j.model.vocab));
    it = cache
             .emplace(key,
                      parallel::pp::balanced_partition(k.layer, k.first_extra, k.last_extra, chunks)
                          .layers)
             .first;
  }
  return it->second;
}

namespace step_model {

namespace {

// A block's pass under ZeRO-3 gathered module by module, one module ahead (Layout::
// z3_module_prefetch; DeepSpeed's stage3.py: a module's hook waits for its own parameters,
// starts the next gather, then the module computes). `items` run in order, each with its
// compute, the gather it waits for before it (0: its parameters are still held) and the
// reduce-scatter of its gradients it starts after it. The gather of the next item that
// needs one runs beside the compute of the items up to it, and the reduce-scatters started
// there share its link; blocks repeat, so the first gather runs beside the previous block's
// last items.
struct WalkItem {
  double compute = 0, gather = 0, rs = 0;
};

double module_walk(const std::vector<WalkItem>& items) {
  std::vector<size_t> waits;
  for (size_t i = 0; i < items.size(); ++i)
    if (items[i].gather > 0) waits.push_back(i);
  double compute = 0, link = 0, t = 0;
  if (waits.empty()) {
    for (const WalkItem& it : items) compute += it.compute, link += it.rs;
    return std::max(compute, link);
  }
  const size_t n = items.size();
  for (size_t w = 0; w < waits.size(); ++w) {
    const size_t next = waits[(w + 1) % waits.size()];
    const size_t end = w + 1 < waits.size() ? next : next + n;
    compute = 0, link = items[next].gather;
    for (size_t i = waits[w]; i < end; ++i)
      compute += items[i % n].compute, link += items[i % n].rs;
    t += std::max(compute, link);
  }
  return t;
}

// Layout::z3_module_prefetch's per-block passes (Prepared::z3_layer_*), their gathers and
// reduce-scatters at `share` seconds per byte. The compute between two modules' hooks: QKV
// with the attention core after it, the projection with the residual add and the second
// norm, MLP in with the activation, MLP out with the last add and the next block's norm;
// what else a pass holds (TP and CP exchanges, the per-pass overhead) goes with QKV.
void prepare_module_walk(const Job& j, const Layout& l, const LayerKernels& k, double share,
                         Prepared& p) {
  const Z3Modules z = z3_modules(j, l);
  const double wb = weight_bytes(j), gb = gradient_bytes(j);
  const double half_norm = k.norm_residual / 2;
  const double fwd[4] = {k.qkv + k.attention + k.softmax, k.proj + half_norm,
                         k.mlp_in + k.activation, k.mlp_out + half_norm};
  const double fwd_sum = fwd[0] + fwd[1] + fwd[2] + fwd[3];
  const double bwd[4] = {2 * (k.qkv + k.softmax) + k.attention_bwd, 2 * (k.proj + half_norm),
                         2 * (k.mlp_in + k.activation), 2 * (k.mlp_out + half_norm)};
  const double bwd_sum = bwd[0] + bwd[1] + bwd[2] + bwd[3];
  const bool full = l.recompute == Recompute::kFull;
  std::vector<WalkItem> f(4), b;
  for (int i = 0; i < 4; ++i) f[size_t(i)] = {fwd[i], z.params[i] * wb * share, 0.0};
  f[0].compute += std::max(0.0, p.pc.fwd - fwd_sum);
  if (full) b = f;  // the recompute's forward gathers every module again
  const double recomputed = full ? p.pc.fwd : 0.0;
  for (int i = 3; i >= 0; --i) {
    const bool gather = !full || z.regathered[i];
    b.push_back({bwd[i], gather ? z.params[i] * wb * share : 0.0, z.params[i] * gb * share});
  }
  b.back().compute += std::max(0.0, p.pc.bwd - recomputed - bwd_sum);
  p.z3_walk = true;
  p.z3_layer_fwd = module_walk(f);
  p.z3_layer_bwd = module_walk(b);
  double block_fwd = 0, block_bwd = 0;
  for (const WalkItem& it : f) block_fwd += it.gather;
  for (const WalkItem& it : b) block_bwd += it.gather + it.rs;
  const double layers = p.split.rank[0];
  p.z3_rest_fwd = std::max(0.0, p.z3_fwd_per_mb - layers * block_fwd);
  p.z3_rest_bwd = std::max(0.0, p.z3_per_mb - p.z3_fwd_per_mb - layers * block_bwd);
}

}  // namespace

Prepared prepare(const Job& j, const Layout& l) {
  const ModelSpec& m = j.model;
  const ClusterSpec& c = j.cluster;
  Prepared p;
  p.pc = pass_costs(j, l);
  p.microbatches = j.batch / (int64_t(l.dp) * l.microbatch);
  p.split = split_of(j, l);
  const double wb = weight_bytes(j);
  const double s = double(j.seq) / l.cp, b = double(l.microbatch), h = m.d_model;
  // p2p: one activation per microbatch; with tp > 1 each TP rank sends 1/tp (Megatron's
  // scatter/gather optimisation) and the pieces are all-gathered over NVLink.
  // Pipeline stages talk over NVLink only when the whole job fits in one node.
  const bool stages_in_node = int64_t(l.tp) * l.dp * l.cp * l.pp <= c.gpus_per_node;
  const double stage_bw = stages_in_node ? c.intra_bytes_per_s : c.inter_bytes_per_s;
  const double stage_lat = stages_in_node ? c.intra_latency_s : c.inter_latency_s;
  if (l.pp > 1) {
    p.p2p = stage_lat + s * b * h * wb / l.tp / stage_bw;
    if (l.tp > 1)
      p.p2p += ring_time(s * b * h * wb, l.tp, 1, c.intra_bytes_per_s, c.intra_latency_s);
  }
  // Tied embeddings with pipelining: the first and the last stage each hold the word
  // embedding and sum its gradients after backward (Megatron-LM's allreduce_embedding_grads
  // and Megatron-Core's finalize_model_grads after the DP reduction, our trainer's `tied`
  // group before it): an all-reduce of V·h/t gradients between two ranks, nothing to hide
  // it behind.
  if (l.pp > 1 && m.tied)
    p.embedding_sync =
        ring_time(double(m.vocab) * h / l.tp * gradient_bytes(j), 2, 2, stage_bw, stage_lat);
  // DP: gradients of the worst stage (stage 0 holds the embedding).
  double psi = 0;
  int worst = 0;
  for (int r = 0; r < l.pp; ++r) {
    const double psi_r = stage_params(j, l, p.split, r);
    if (psi_r > psi) psi = psi_r, worst = r;
  }
  // The ranks that hold the same parameters: DP and CP (a CP rank's gradients cover its part
  // of the sequence), tp-strided: gpus_per_node / tp of them share a node.
  const int dpn = l.dp * l.cp;
  // MoE with ep: the worst stage's routed experts (1/ep of them, split over expert tp) reduce
  // over expert-dp, dpn / ep ranks ep·cp·tp apart; the rest over dp × cp. One after the other.
  const double psi_e = p.split.rank[size_t(worst)] * expert_params_per_layer(j, l);
  auto reduction = [&](double params, int n, int per_node) {
    const double grad_bytes = params * gradient_bytes(j);
    double rs = hier_collective(j, grad_bytes, n, per_node, 1);   // gradients
    double ag = hier_collective(j, params * wb, n, per_node, 1);  // parameters
    if (l.zero >= 3 && l.z3_bytes_per_s > 0 && n > 1) {
      // At the software's own rate (Layout::z3_bytes_per_s): (n − 1)/n of the bytes.
      const double share = double(n - 1) / n / l.z3_bytes_per_s;
      rs = grad_bytes * share;
      ag = params * wb * share;
    }
    if (l.zero <= 1) {
      p.dp_comm += l.zero == 0 ? hier_collective(j, grad_bytes, n, per_node, 2) : rs + ag;
    } else if (l.zero == 2) {
      p.dp_comm += double(p.microbatches) * rs + ag;  // reduce-scatter every microbatch
    } else {  // forward gathers once; backward (with any recomputation) 1 + f times
      const double f = l.recompute == Recompute::kFull ? regathered_fraction(j, l) : 0.0;
      p.z3_fwd_per_mb += ag;
      p.z3_per_mb += (2 + f) * ag + rs;
      p.dp_comm += double(p.microbatches) * ((2 + f) * ag + rs);
    }
  };
  // tp across nodes: dp x cp are the fastest dimensions, as many as fit share a node.
  reduction(
      psi - psi_e, dpn,
      l.tp_across_nodes ? std::min(dpn, c.gpus_per_node) : std::max(1, c.gpus_per_node / l.tp));
  // Expert-dp: dp·cp / ep ranks, Megatron-Core's tp ranks too where they hold the same
  // experts (expert tp 1): a node holds gpus_per_node / (expert tp · ep) of them (ours: the
  // tp-strided dp·cp / ep, gpus_per_node / (tp · ep)).
  const int edp = expert_dp(j, l);
  const int edp_stride = (runs_our_runtime(j) ? l.tp : moe_expert_tp(j, l)) * l.ep;
  if (psi_e > 0) reduction(psi_e, edp, std::max(1, c.gpus_per_node / edp_stride));
  if (l.zero >= 3 && l.z3_module_prefetch && l.z3_bytes_per_s > 0 && l.pp == 1 && dpn > 1 &&
      c.compute_units == 0)
    prepare_module_walk(j, l, layer_kernels(j, l, per_rank_share(j)),
                        double(dpn - 1) / dpn / l.z3_bytes_per_s, p);
  // Optimizer: memory-bound AdamW over the local shard (mixed: 30 bytes read+written per
  // parameter with fp32 master and moments; f32: 28).
  // (Our runtime shards the dense states over expert-dp too: plan/moe.h ep_model_states.)
  const int dense_dp = runs_our_runtime(j) ? std::max(1, dpn / l.ep) : dpn;
  const double opt_params = l.zero >= 1 ? (psi - psi_e) / dense_dp + psi_e / edp : psi;
  p.optimizer = opt_params * (mixed(j) ? 30.0 : 28.0) /
                (c.gpu.hbm_bytes_per_s * c.gpu.hbm_efficiency * per_rank_share(j));
  if (!l.grad_accum_fusion) {
    for (size_t k = 0; k < p.split.chunk.size(); ++k)
      p.chunk_psi.push_back(chunk_params(j, l, p.split, int(k)));
    // Read the temporary weight gradient (the parameters' dtype), read and write the
    // accumulation buffer (main_grad in the gradients' dtype: fp16 6 bytes, bf16 10; torch
    // DDP's .grad in the parameters'). With ZeRO-2/3 the buffer is the rank's shard, and only
    // the reduce-scattered shard is added.
    const double acc = l.torch_ddp ? wb : gradient_bytes(j);
    const double bytes = (wb + 2 * acc) / (l.zero >= 2 ? dpn : 1);
    p.accum_per_param_s =
        bytes / (c.gpu.hbm_bytes_per_s * c.gpu.hbm_efficiency * per_rank_share(j));
    // Autograd's .grad takes the first gradient as it is; a main_grad buffer adds every one.
    p.accum_first_free = l.torch_ddp;
  }
  // The last microbatch's backward on that stage hides the reduction when overlapped.
  p.comm_uses_compute = c.compute_units > 0;
  p.dp_window = l.dp_overlap && !p.comm_uses_compute ? p.split.rank[size_t(worst)] * p.pc.bwd : 0.0;
  return p;
}

// Megatron-Core's overlapped p2p (interleaved only): the rank computes on while its
// transfers run; the replay still delays the receiver by the transfer.
bool p2p_overlapped(const Layout& l, const Prepared& p) {
  return l.pp_overlap && l.schedule == "interleaved" && !p.comm_uses_compute;
}

// Blocking p2p on GPUs (Megatron-LM's batch_isend_irecv, wait, torch.cuda.synchronize();
// NCCL's send waits for its receive): neighbours exchange in lock-step, each exchange a batch
// (pp::replay_rendezvous over the batched lowering). A shared host runs our runtime, whose
// sends are asynchronous copies by the same cores: charged as rank time instead.
bool rendezvous_p2p(const Layout& l, const Prepared& p) {
  return !p2p_overlapped(l, p) && !p.comm_uses_compute;
}

double chunk_cost(const Prepared& p, const Layout& l, int r, const PipeAction& a) {
  const int vs = a.chunk, V = l.pp * l.virtual_stages;  // the IR's global chunk index
  const bool fwd = a.kind == PipeKind::kForward;
  const double layers = p.split.chunk[size_t(vs)];
  double c = layers * (fwd ? p.pc.fwd : p.pc.bwd);
  if (vs == V - 1) c += fwd ? p.pc.head_fwd : p.pc.head_bwd;
  if (vs == 0) c += fwd ? p.pc.embed_fwd : p.pc.embed_bwd;
  // Zero-bubble split: the input gradient (with any recomputation) and the weight gradient
  // are each half of the backward GEMMs.
  const double recompute = layers * (p.pc.bwd - p.pc.bwd_plain);
  if (a.kind == PipeKind::kBackwardInput) c = recompute + (c - recompute) / 2;
  if (a.kind == PipeKind::kBackwardWeight) c = (c - recompute) / 2;
  // Unfused gradient accumulation: after the weight gradients (zb1: the W action).
  const bool weight_grads = a.kind == PipeKind::kBackward || a.kind == PipeKind::kBackwardWeight;
  if (weight_grads && p.accum_per_param_s > 0 && !(p.accum_first_free && a.microbatch == 0))
    c += p.accum_per_param_s * p.chunk_psi[size_t(vs)];
  // Our runtime's sends on a shared host: a copy by the rank's cores per action with a
  // neighbour (on GPUs the replay's rendezvous charges the blocking exchanges).
  if (V > 1 && a.kind != PipeKind::kBackwardWeight && p.comm_uses_compute) c += p.p2p;
  const bool pass = a.kind == PipeKind::kForward || a.kind == PipeKind::kBackward;
  if (p.z3_walk && pass) {  // module by module: the blocks' walk, the rest beside the head
    const double rest = c - layers * (fwd ? p.pc.fwd : p.pc.bwd);
    c = layers * (fwd ? p.z3_layer_fwd : p.z3_layer_bwd) +
        std::max(rest, fwd ? p.z3_rest_fwd : p.z3_rest_bwd);
  } else if (p.z3_per_mb > 0) {  // block by block: the pass or its collectives, the longer
    const double comm = fwd ? p.z3_fwd_per_mb : p.z3_per_mb - p.z3_fwd_per_mb;
    c = p.comm_uses_compute ? c + comm : std::max(c, comm);
  }
  return c;
}

// How much faster a pipeline rank computes while only `active` of the P pipeline ranks do,
// on a host whose cores all ranks share (compute_units > 0). Costs assume every rank
// computes at once (per_rank_share: 1/N of the host each); a rank's threads cap what it can
// use (the trainer gives each max(1, cores / N)), and the N / P ranks of each pipeline rank
// (its DP, TP and CP peers) compute alongside it.
double shared_speed(const Job& j, const Layout& l, int active) {
  const double ranks_busy = double(active) * double(j.gpus) / double(l.pp);
  return std::min(rank_cap(j), 1.0 / ranks_busy) / per_rank_share(j);
}

ReplayResult replay_layout(const Job& j, const Layout& l, const Prepared& p, bool keep_spans) {
  const bool rendezvous = rendezvous_p2p(l, p);
  const PipeSchedule sched = make_schedule(
      l.schedule, l.pp, l.virtual_stages, int(p.microbatches),
      rendezvous ? parallel::pp::Lowering::kBatched : parallel::pp::Lowering::kPerAction);
  auto cost = [&](int r, const PipeAction& a) { return chunk_cost(p, l, r, a); };
  ReplayResult out =
      j.cluster.compute_units > 0 && l.pp > 1
          ? replay_shared(
                sched, cost, p.p2p, [&](int active) { return shared_speed(j, l, active); },
                keep_spans)
          : replay(sched, cost, p.p2p, rendezvous ? P2p::kRendezvous : P2p::kAsync, keep_spans);
  // Each rank's forward work, in the replay's cost units (busy_s holds forward + backward).
  out.forward_s.assign(sched.ranks.size(), 0.0);
  for (size_t r = 0; r < sched.ranks.size(); ++r)
    for (const PipeAction& a : sched.ranks[r])
      if (a.kind == PipeKind::kForward) out.forward_s[r] += cost(int(r), a);
  return out;
}

// A floor under the step time (the search replays layouts in its order and stops past the
// k-th best): the blocks of every microbatch on the busiest rank (embedding and head apart),
// the optimizer, the tied embedding's sync and the DP reduction's exposed part. On a shared host a
// rank computing alone runs up to shared_speed(1) times its all-busy rate, and P ranks never
// compute more than P ranks' worth at once (shared_speed(k) · k <= P): the floor is the larger of
// the busiest rank's work at that speed and the average rank's work.
double lower_bound(const Job& j, const Prepared& p, const Layout& l) {
  double layers = p.split.busiest;
  if (j.cluster.compute_units > 0 && l.pp > 1)
    layers = std::max(double(j.model.n_layer) / l.pp, layers / shared_speed(j, l, 1));
  const double per_mb = layers * (p.pc.fwd + p.pc.bwd);
  return double(p.microbatches) * per_mb + p.optimizer + p.embedding_sync +
         std::max(0.0, l.zero >= 3 ? 0.0 : p.dp_comm - p.dp_window);
}

void finish(const Job& j, const Prepared& p, Estimate& e) {
  const Layout& l = e.layout;
  e.dp_comm_s = p.dp_comm;
  e.dp_exposed_s = l.zero >= 3 ? 0.0 : std::max(0.0, p.dp_comm - p.dp_window);
  e.optimizer_s = p.optimizer;
  e.embedding_sync_s = p.embedding_sync;
  e.pipeline_s = e.replay.makespan_s;
  e.step_time_s = e.pipeline_s + e.embedding_sync_s + e.dp_exposed_s + e.optimizer_s;
  const double tokens = double(j.batch) * j.seq;
  e.tokens_per_s = tokens / e.step_time_s;
  const double model_flops = model_flops_per_token(j.model, j.seq) * tokens;
  const double hw_flops = hw_flops_per_token(j.model, j.seq, l.recompute) * tokens;
  e.tflops_per_gpu = model_flops / e.step_time_s / double(j.gpus) / 1e12;
  e.hw_tflops_per_gpu = hw_flops / e.step_time_s / double(j.gpus) / 1e12;
  const double peak = j.cluster.gpu.peak_flops(j.dtype) * per_rank_share(j);
  e.mfu = e.tflops_per_gpu * 1e12 / peak;
  const double busy = *std::max_element(e.replay.busy_s.begin(), e.replay.busy_s.end());
  // A shared host's ranks can finish sooner than their work at the all-busy rate: no bubble.
  e.bubble_fraction = e.pipeline_s > 0 ? std::max(0.0, e.pipeline_s - busy) / e.step_time_s : 0;
  const double mb = double(p.microbatches) * l.virtual_stages;
  const size_t r = size_t(std::max_element(e.replay.busy_s.begin(), e.replay.busy_s.end()) -
                          e.replay.busy_s.begin());
  e.busiest_rank = int(r);
  e.forward_s = e.replay.forward_s[r];
  e.backward_s = e.replay.busy_s[r] - e.replay.forward_s[r];
  e.layer_forward_s = p.pc.fwd;
  e.layer_backward_s = p.pc.bwd;
  const double layers = double(p.microbatches) * p.split.rank[r];
  e.tp_comm_s = layers * (p.pc.tp_fwd + p.pc.tp_bwd);
  {
    const std::vector<int> chunks = chunk_layers(j, l);
    const bool first = r == 0, last = (chunks.size() - 1) % size_t(l.pp) == r;
    e.tp_vocab_s = double(p.microbatches) *
                   ((first ? p.pc.vocab_first : 0.0) + (last ? p.pc.vocab_last : 0.0));
  }
  e.cp_comm_s = layers * (p.pc.cp_fwd + p.pc.cp_bwd);
  e.ep_comm_s = layers * (p.pc.ep_fwd + p.pc.ep_bwd);
  e.moe_tp_comm_s = layers * (p.pc.moe_tp_fwd + p.pc.moe_tp_bwd);
  e.pp_comm_s = l.pp > 1 && !p2p_overlapped(l, p) ? 2 * mb * p.p2p : 0;
  // The busiest rank's adds, as its forward_s and backward_s: its chunks' parameters, once
  // per backward.
  const double adds = double(p.microbatches - (p.accum_first_free ? 1 : 0));
  e.grad_accum_s = adds * stage_params(j, l, p.split, int(r)) * p.accum_per_param_s;
}

}  // namespace step_model

using namespace step_model;

Estimate estimate(const Job& job, const Layout& given, bool keep_spans) {
  Job j = job;
  j.cluster = job.cluster.for_job(job.gpus);
  if (auto why = invalid_reason(j, given)) fail("layout refused: {}", *why);
  const Layout l = as_run(j, given);
  Estimate e;
  e.layout = l;
  e.memory = memory_per_gpu(j, l, &e.worst_stage, &e.in_flight);
  const Prepared p = prepare(j, l);
  e.microbatches = p.microbatches;
  e.replay = replay_layout(j, l, p, keep_spans);
  finish(j, p, e);
  return e;
}

}  // namespace mt::plan

// The planner's memory model (docs/planner.md "Memory"): model states by ZeRO stage, the
// activations each pipeline rank keeps for the microbatch-chunks in flight (Korthikanti et
// al.'s Table 2 for Megatron-LM; the allocator's own accounting for our f32 runtime), the
// communication buffers and the optimizer step's fp32 gradients, per pipeline stage.
#include <algorithm>

#include "comm/mpi.h"
#include "plan/moe.h"
#include "plan/pipeline.h"
#include "plan/planner.h"
#include "plan/stages.h"

namespace mt::plan {

namespace {

// Our runtime's context-parallel exchange workspace (f32, one set per rank shared by the
// layers: parallel/context.cpp workspace_elems, docs/context_parallel.md "Memory"), with
// blk = b·(S/cp)·2·(kv_heads/t)·hd floats a rank's K|V rows: ring 4 blocks, a piece's output
// and its log-sum-exp; all-gather 1 + cp blocks and two [b, S, 2·kv/t] buffers in global
// order; a2a four [b, S, (a + 2·kv_heads)/t/cp·hd] head-group buffers and two outputs
// [b, S, a/t/cp·hd].
double cp_workspace_bytes(const Job& j, const Layout& l) {
  if (l.cp <= 1) return 0;
  const ModelSpec& m = j.model;
  const double t = l.tp, cp = l.cp, b = double(l.microbatch), S = double(j.seq), s = S / cp;
  const double hd = double(m.head_dim()), a = double(m.n_head) / t, kvh = double(m.n_kv_head) / t;
  const double blk = b * s * 2 * kvh * hd;
  double floats = 0;
  if (l.cp_comm == "all-gather") {
    floats = blk + cp * blk + 2 * b * S * 2 * kvh * hd + 2;
  } else if (l.cp_comm == "a2a") {
    const double g = b * S * std::floor((a + 2 * kvh) / cp) * hd;
    floats = 4 * g + 2 * b * S * std::floor(a / cp) * hd + 1;
  } else {
    floats = 4 * blk + b * s * a * hd + b * a * s;
  }
  return 4 * floats;
}

// Activation bytes one layer keeps for backward for one microbatch (Korthikanti et al.
// 2022, Table 2, generalised to GQA / SwiGLU; docs/planner.md).
double layer_activation_bytes(const Job& job, const Layout& l, Recompute rc) {
  const Job j = compute_view(job, l);  // a MoE MLP as the dense width a token passes through
  const ModelSpec& m = j.model;
  // With CP a rank holds s = seq / cp tokens whose queries attend over all S = seq keys.
  const double s = double(j.seq) / l.cp, S = double(j.seq), b = double(l.microbatch), h = m.d_model,
               F = m.d_ff, kv = m.kv_dim(), a = m.n_head, t = l.tp;
  if (!mixed(j)) {
    // Our f32 runtime (docs/flops.md, docs/tensor_parallel.md), floats per token: whole
    // ln1, res2, ln2, block output and 4 norm statistics (/t with SP); split qkv,
    // attention output, fc, GELU; probabilities n_head·T/t, or with the blockwise kernel
    // (runs_our_flash) one log-sum-exp per head, n_head/t (kernels::attention_stash_elems).
    // t = 1: 8C + 2F + 4 + n_head·T (flash: n_head). Full recomputation keeps the block
    // output only, selective all but the attention's stash (model/layers.h Block::Keep).
    // With MoE blocks every block has the MoE layer's set (plan/moe.h our_moe_bytes) and,
    // while any block is dense, the dense MLP's fc and GELU (model/layers.cpp).
    const double rows = l.sp ? t : 1;
    if (rc == Recompute::kFull) return 4.0 * s * b * h / rows;
    const double att = rc == Recompute::kNone ? a / t * (runs_our_flash(j, l) ? 1.0 : S) : 0.0;
    const ModelSpec& mo = job.model;
    const double dense_ff = mo.is_moe() && mo.moe_layers >= mo.n_layer ? 0.0 : double(mo.d_ff);
    return 4.0 * s * b * ((4 * h + 4) / rows + (4 * h + 2 * dense_ff) / t + att) +
           our_moe_bytes(job, l).block;
  }
  const bool drop = dropout(j);
  if (rc == Recompute::kFull) return 2.0 * s * b * h / (l.sp ? t : 1);
  double replicated = s * b * h * (4 + 2 + 2 + (drop ? 2 : 0));
  // The MLP keeps its fc1 output and fc2's input: GELU 2F + 2F bytes; SwiGLU's fc1 output is
  // gate and up (4F) and fc2's input F (2F), with an unfused SiLU also its output (2F) for
  // the product's backward (Layout::fused_swiglu).
  const double mlp = m.swiglu ? (l.fused_swiglu ? 6.0 : 8.0) : 4.0;
  double divided = s * b * (2 * h + 4 * kv + 2 * h) + s * b * F * mlp;
  // Unfused: the probabilities (2 bytes), with dropout also its mask (1) and output (2).
  double core = 0;
  if (rc == Recompute::kNone && !l.fused_attention) core = (drop ? 5.0 : 2.0) * a * s * S * b;
  return (l.sp ? replicated / t : replicated) + divided / t + core / t;
}

}  // namespace

MemoryBytes zero_model_states(double psi, int dp, int zero, const std::string& dtype) {
  const bool mp = dtype != "f32";
  const double wb = mp ? 2 : 4, gb = gradient_bytes(dtype), ob = mp ? 12 : 8;
  MemoryBytes mb;
  mb.parameters = psi * wb / (zero >= 3 ? dp : 1);
  mb.gradients = psi * gb / (zero >= 2 ? dp : 1);
  mb.optimizer = psi * ob / (zero >= 1 ? dp : 1);
  return mb;
}

MemoryBytes memory_per_gpu(const Job& j, const Layout& l, int* worst_stage, int* in_flight) {
  const int64_t mbs = j.batch / (int64_t(l.dp) * l.microbatch);
  PipeSchedule sched = make_schedule(l.schedule, l.pp, l.virtual_stages, static_cast<int>(mbs));
  // Our runtime's pool sizes every set for the largest chunk: no profile to weigh.
  const ChunkFlight chunks = spare_set(j) ? ChunkFlight{} : chunk_flight(sched);
  return memory_with_flight(j, l, max_in_flight(sched, spare_set(j)), worst_stage, in_flight,
                            &chunks);
}

std::vector<MemoryBytes> memory_by_stage(const Job& j, const Layout& l) {
  const int64_t mbs = j.batch / (int64_t(l.dp) * l.microbatch);
  PipeSchedule sched = make_schedule(l.schedule, l.pp, l.virtual_stages, static_cast<int>(mbs));
  // Our runtime's pool sizes every set for the largest chunk: no profile to weigh.
  const ChunkFlight chunks = spare_set(j) ? ChunkFlight{} : chunk_flight(sched);
  return stage_memory(j, l, max_in_flight(sched, spare_set(j)), &chunks);
}

MemoryBytes memory_with_flight(const Job& j, const Layout& l, const std::vector<int>& flight,
                               int* worst_stage, int* in_flight, const ChunkFlight* chunks) {
  const std::vector<MemoryBytes> stages = stage_memory(j, l, flight, chunks);
  MemoryBytes worst;
  for (int r = 0; r < l.pp; ++r) {
    const MemoryBytes& mb = stages[size_t(r)];
    if (mb.total() > worst.total()) {
      worst = mb;
      if (worst_stage) *worst_stage = r;
      if (in_flight) *in_flight = flight[r];
    }
  }
  return worst;
}

std::vector<MemoryBytes> stage_memory(const Job& j, const Layout& l, const std::vector<int>& flight,
                                      const ChunkFlight* chunks) {
  const ModelSpec& m = j.model;
  const Split split = split_of(j, l);
  const double act_layer = layer_activation_bytes(j, l, l.recompute);
  const double s = double(j.seq) / l.cp, b = double(l.microbatch), h = m.d_model, t = l.tp,
               V = m.vocab, wb = weight_bytes(j);
  std::vector<MemoryBytes> stages;
  for (int r = 0; r < l.pp; ++r) {
    const double psi_r = stage_params(j, l, split, r);
    // Routed experts: sharded over ep (and expert tp), their states over expert-dp
    // (plan/moe.h).
    const double experts_r = split.rank[size_t(r)] * expert_params_per_layer(j, l);
    MemoryBytes mb = ep_model_states(psi_r, experts_r, j, l);
    // fp16: the step's fp32 copy of the shard's gradients (bf16 keeps them in fp32 already).
    if (j.dtype == "fp16") mb.step_gradients_f32 = 4 * psi_r / (l.zero >= 1 ? l.dp * l.cp : 1);
    // Megatron's tensors are allocated as they come: each microbatch-chunk in flight keeps
    // its own chunk's layers, at the rank's worst moment (chunk_flight). Our runtime's pool
    // sizes every set for the rank's largest chunk; without the chunk profile that is also
    // the bound taken here.
    const double emb_rows = s * b * h / (l.sp ? t : 1);
    double act = flight[r] * split.rank_max[size_t(r)] * act_layer;
    if (mixed(j) && chunks && !spare_set(j)) {
      std::vector<double> bytes(size_t(l.virtual_stages));
      for (size_t c = 0; c < bytes.size(); ++c)
        bytes[c] = split.chunk[c * size_t(l.pp) + size_t(r)] * act_layer;
      // The embedding's output (+ dropout's mask) on the first chunk; a chunk of the
      // embedding alone sends its output on and frees it (Megatron's deallocate_output_tensor,
      // Llama 3's "proactively deallocate ... the output tensors of each pipeline stage"),
      // keeping only dropout's mask.
      if (r == 0)
        bytes[0] += emb_rows * (split.chunk[0] > 0 ? (dropout(j) ? 3 : 2) : (dropout(j) ? 1 : 0));
      act = peak_bytes_in_flight(*chunks, r, bytes);
    } else if (mixed(j) && r == 0) {  // embedding output (+ dropout's mask)
      act += flight[r] * emb_rows * (dropout(j) ? 3 : 2);
    }
    if (l.recompute == Recompute::kFull)  // one layer's full set while it is recomputed
      act += layer_activation_bytes(j, l, Recompute::kNone);
    if (mixed(j)) {
      if (r == l.pp - 1) act += 4 * s * b * V / t + 2 * s * b * h;  // f32 logits, final norm
    } else {
      // Our runtime (docs/flops.md, train/pipeline_stage.cpp): one activation set per
      // microbatch held (with pipelining the stage's pool, flight[r] buffers), each with the
      // embedding output (C) and, when pipelined, the received input gradient (C); on the
      // head's rank also the final norm (C + 2 stats), the vocab-parallel logits and the
      // loss stats (2). The backward scratch (below) and one n_head·T·T score matrix per
      // sequence, once (the blockwise kernel: none, one float).
      // Selective recomputation: one attention stash that every layer recomputes into (the
      // probabilities, or with the blockwise kernel the log-sum-exp of each row and head);
      // zero-bubble: each layer's input-gradient results kept for its weight gradient
      // (Block::make_stash: qkv' 3C/t, C, fc' F/t, C) in every buffer.
      const bool flash = runs_our_flash(j, l);
      const double att_stash = 4 * b * m.n_head / t * s * (flash ? 1.0 : double(j.seq));
      if (l.recompute == Recompute::kSelective) act += att_stash;
      if (l.schedule == "zb1")
        act += flight[r] * split.rank_max[size_t(r)] * 4 * s * b * (2 * h + (3 * h + m.d_ff) / t);
      const double rows = l.sp ? t : 1;  // SP splits the residual region's rows
      double set = (l.pp > 1 ? 2 * h : h) / rows;
      if (r == l.pp - 1)  // TP: the cross-entropy's max and sums (3); SP: the gathered norm
        set += (h + 2) / rows + V / t + 2 + (l.tp > 1 ? 3 : 0) + (l.sp ? h : 0);
      act += flight[r] * 4 * s * b * set;
      // Scratch: the residual gradient and a block's input gradient (2C), attention output
      // and qkv gradients (4C/t), the MLP's (2F/t); SP's gathered and partial inputs (2C).
      act += 4 * s * b * (2 * h + 4 * h / t + 2 * m.d_ff / t + (l.sp ? 2 * h : 0)) +
             (flash ? 4.0 : att_stash) + cp_workspace_bytes(j, l) + our_moe_bytes(j, l).scratch;
    }
    mb.activations = act;
    // Communication buffers: p2p send/recv (2 each way; our runtime sends from and receives
    // into the pool's sets), ZeRO-3 gathered units (2 blocks), ZeRO-2 gradient pool (2 blocks).
    double comm = 0;
    // (Our runtime receives into its activation sets: the spare one, above.)
    if (l.pp > 1 && mixed(j) && !spare_set(j)) comm += 4 * s * b * h * wb / (l.sp ? t : 1);
    if (mixed(j)) {
      const double block =
          m.block_params_per_tp(l.tp, l.ep, runs_our_runtime(j), moe_expert_tp(j, l));
      if (l.zero >= 2) comm += 2 * block * gradient_bytes(j);  // gradient pool
      if (l.zero >= 3) comm += 2 * block * wb;
    } else if (l.zero >= 2) {
      // Our runtime's unit pool (docs/data_parallel.md): 4·(E + H + 2·Bk) bytes for the
      // gradients, the same again for ZeRO-3's gathered values.
      const double pool =
          4 * (m.embedding_params_per_tp(l.tp) + m.head_params_per_tp(l.tp) +
               2 * m.block_params_per_tp(l.tp, l.ep, runs_our_runtime(j), moe_expert_tp(j, l)));
      comm += (l.zero >= 3 ? 2 : 1) * pool;
    }
    // Our runtime with ep: the dense gradients' packed buffer for their sum over ep.
    if (runs_our_runtime(j)) comm += our_ep_pack_bytes(l, psi_r, psi_r - experts_r);
    if (!mixed(j) && l.sp) {
      // Our runtime's SP gradient sync (parallel/tp.h ReplicatedGradSync): one packed buffer
      // of the layer norms' and the position table's gradients (sums over sequence shards).
      // With ZeRO it packs only the shard's part; counted whole (an upper bound).
      const double norm = m.bias ? 2 * h : h;
      double packed = split.rank[size_t(r)] * 2 * norm;
      if (r == 0 && m.learned_pos) packed += double(m.seq) * h;
      if (r == l.pp - 1) packed += norm;
      comm += 4 * packed;
    }
    // The mpi backend's reduce-scatter scratch (comm/mpi.h): n pieces of at most
    // kMpiSegmentBytes, kept at its largest. DP (and CP) reduce the stage's gradients in one
    // call (ZeRO-2/3: one unit at a time); TP reduces a microbatch's activations.
    if (j.cluster.backend == "mpi") {
      auto scratch = [](double bytes, int n) {
        return n > 1 ? n * std::min(bytes / n, double(comm::kMpiSegmentBytes)) : 0.0;
      };
      const double gb = gradient_bytes(j);
      const double unit =
          std::max({m.embedding_params_per_tp(l.tp), m.head_params_per_tp(l.tp),
                    m.block_params_per_tp(l.tp, l.ep, runs_our_runtime(j), moe_expert_tp(j, l))}) *
          gb;
      const double dp_bytes = l.zero >= 2 ? unit : psi_r * gb;
      // One backend, and one scratch, per group: the DP and TP groups' add up.
      comm += scratch(dp_bytes, l.dp * l.cp) + scratch(s * b * h * wb, l.tp);
      // The tied embedding's gradient: the first and the last stage sum it in a group of two.
      if (l.pp > 1 && m.tied && (r == 0 || r == l.pp - 1))
        comm += scratch(double(m.vocab) * h / t * gb, 2);
    }
    mb.communication = comm;
    stages.push_back(mb);
  }
  return stages;
}

}  // namespace mt::plan

// Context parallelism in the planner: CP ranks hold the same parameters as DP ranks (one
// gradient group, one ZeRO shard group), split the sequence while every query still attends
// over all of it, and pay ring attention's transfers only where the attention compute of a
// block cannot hide them.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/flash_attention.h"
#include "plan/kernels.h"
#include "plan/planner.h"
#include "plan_test_util.h"
#include "train/trainer.h"

namespace mt::plan {
namespace {

Job llama_job(int64_t gpus) {
  Job j;
  j.model = model_preset("llama3-70b");
  j.seq = 8192;
  j.model.seq = j.seq;
  j.batch = 64;
  j.dtype = "bf16";
  j.gpus = gpus;
  j.cluster = cluster_preset("dgx-h100");
  return j;
}

Layout layout(int dp, int tp, int cp, int zero) {
  Layout l;
  l.dp = dp;
  l.tp = tp;
  l.cp = cp;
  l.zero = zero;
  l.microbatch = 1;
  l.recompute = Recompute::kFull;
  return l;
}

TEST(PlanContextParallel, CpRanksShareTheDataParallelGroup) {
  const Job j = llama_job(64);
  for (int zero : {0, 1, 3}) {
    SCOPED_TRACE(zero);
    const Estimate with_cp = estimate(j, layout(4, 8, 2, zero));
    const Estimate dp_only = estimate(j, layout(8, 8, 1, zero));
    EXPECT_DOUBLE_EQ(with_cp.memory.parameters, dp_only.memory.parameters);
    EXPECT_DOUBLE_EQ(with_cp.memory.gradients, dp_only.memory.gradients);
    EXPECT_DOUBLE_EQ(with_cp.memory.optimizer, dp_only.memory.optimizer);
    EXPECT_DOUBLE_EQ(with_cp.memory.step_gradients_f32, dp_only.memory.step_gradients_f32);
    if (zero < 3) {
      EXPECT_DOUBLE_EQ(with_cp.dp_comm_s, dp_only.dp_comm_s);
    }
  }
}

TEST(PlanContextParallel, SplittingTheSequenceKeepsEachRanksWork) {
  // Flat GEMM efficiency, no per-pass overhead, links fast enough to hide the ring: a rank
  // of dp 4 x cp 2 computes the same FLOPs and bytes as one of dp 8 (half the tokens per
  // microbatch, twice the microbatches, each query over all 8192 keys).
  Job j = llama_job(64);
  j.cluster.gpu.gemm.d0 = 0;
  j.cluster.gpu.kernel_overhead_s = 0;
  j.cluster.intra_bytes_per_s = j.cluster.inter_bytes_per_s = 1e18;
  j.cluster.intra_latency_s = j.cluster.inter_latency_s = 0;
  const Estimate with_cp = estimate(j, layout(4, 8, 2, 1));
  const Estimate dp_only = estimate(j, layout(8, 8, 1, 1));
  EXPECT_EQ(with_cp.microbatches, 2 * dp_only.microbatches);
  EXPECT_NEAR(with_cp.forward_s, dp_only.forward_s, 1e-12 * dp_only.forward_s);
  EXPECT_NEAR(with_cp.backward_s, dp_only.backward_s, 1e-12 * dp_only.backward_s);
  EXPECT_EQ(with_cp.cp_comm_s, 0.0);
  // Activations per microbatch: half the tokens, and the attention over all keys is flash
  // (no score matrix kept) for a Llama model, so exactly half.
  Layout none_cp = layout(4, 8, 2, 1), none_dp = layout(8, 8, 1, 1);
  none_cp.recompute = none_dp.recompute = Recompute::kNone;
  EXPECT_NEAR(memory_per_gpu(j, none_cp).activations * 2, memory_per_gpu(j, none_dp).activations,
              0.02 * memory_per_gpu(j, none_dp).activations);
}

TEST(PlanContextParallel, RingTransfersShowWhereComputeCannotHideThem) {
  Job j = llama_job(64);
  // A slow inter-node link: the ring inside a node (tp 4 x cp 2) hides behind the block
  // attention; across nodes (tp 8 x cp 2) it does not.
  j.cluster.inter_bytes_per_s = 1e9;
  const Estimate inside = estimate(j, layout(8, 4, 2, 1));
  const Estimate across = estimate(j, layout(4, 8, 2, 1));
  EXPECT_EQ(inside.cp_comm_s, 0.0);
  EXPECT_GT(across.cp_comm_s, 0.0);
  // Per layer and microbatch: fwd + recomputed fwd + bwd = 2 (t − x) + (2t − 2x) over cp − 1
  // = 1 step, t the transfer of the local K and V (bf16, GQA: 8 KV heads of 128 per 8 TP
  // ranks), x the block attention.
  const double kv_bytes = 2.0 * 4096 * (8 * 128) / 8 * 2;
  const double t = j.cluster.inter_latency_s + kv_bytes / j.cluster.inter_bytes_per_s;
  const double per_layer_mb = across.cp_comm_s / double(across.microbatches) / 80;
  EXPECT_LT(per_layer_mb, 4 * t);
  EXPECT_GT(per_layer_mb, 4 * t * 0.5);
  EXPECT_GT(across.step_time_s, estimate(j, layout(8, 8, 1, 1)).step_time_s);
  // A CP ring refuses a sequence that does not split in 2·cp chunks.
  Job odd = j;
  odd.seq = 8190;
  odd.model.seq = odd.seq;
  EXPECT_TRUE(invalid_reason(odd, layout(4, 8, 2, 1)).has_value());
}

// The three exchanges train runs (--cp-comm), costed as they run: the ring's transfers
// hide behind the block attention, the all-gather's and the all-to-all's collectives do not.
TEST(PlanContextParallel, EachExchangeCostsWhatItMoves) {
  Job j = llama_job(64);
  j.cluster.inter_bytes_per_s = 1e9;  // slow: tp 8 x cp 2 crosses nodes
  Layout ring = layout(4, 8, 2, 1), ag = ring;
  ag.cp_comm = "all-gather";
  const Estimate r = estimate(j, ring), g = estimate(j, ag);
  EXPECT_EQ(g.layout.cp_comm, "all-gather");
  // Per layer and microbatch, with full recomputation: the all-gather forward twice (forward
  // and recomputed) and backward's gather and reduce-scatter, each a ring collective of the
  // cp = 2 blocks: (cp − 1)/cp · cp·kv_bytes / bw + (cp − 1)·lat = kv_bytes / bw + lat.
  const double kv_bytes = 2.0 * 4096 * (8 * 128) / 8 * 2;
  const double one = kv_bytes / j.cluster.inter_bytes_per_s + j.cluster.inter_latency_s;
  const double per_layer_mb = g.cp_comm_s / double(g.microbatches) / 80;
  EXPECT_NEAR(per_layer_mb, 4 * one, 1e-9 * one);
  EXPECT_GT(g.cp_comm_s, r.cp_comm_s);  // the ring hides part of its transfers
  // a2a (Ulysses): 64 query and 8 kv heads over tp 2 leave 32 and 4 per tp rank, which cp 2
  // and 4 split. Not overlapped, so it costs even inside a node; its volume per rank falls as
  // cp grows ((cp − 1)/cp² of the sequence's q|k|v|o).
  Layout a2a2 = layout(16, 2, 2, 1), a2a4 = layout(8, 2, 4, 1);
  a2a2.cp_comm = a2a4.cp_comm = "a2a";
  const Estimate u2 = estimate(j, a2a2), u4 = estimate(j, a2a4);
  EXPECT_GT(u2.cp_comm_s, 0.0);
  EXPECT_LT(u4.cp_comm_s / double(u4.microbatches), u2.cp_comm_s / double(u2.microbatches));
  // Refused as train refuses it: 8 kv heads over tp 4 leave 2 per tp rank, which cp 4 does
  // not split.
  Layout odd = layout(4, 4, 4, 1);
  odd.cp_comm = "a2a";
  const auto why = invalid_reason(j, odd);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("2 key/value heads per tp rank do not divide by cp 4"), std::string::npos)
      << *why;
  Layout unknown = ring;
  unknown.cp_comm = "p2p";
  EXPECT_TRUE(invalid_reason(j, unknown).has_value());
}

// Our runtime's attention memory follows its kernel: on a CPU host the blockwise kernel from
// train::kCpuFlashMinSeq (and always with cp) keeps n_head floats per token, so the f32
// activations grow as T, not T².
TEST(PlanContextParallel, OurAttentionMemoryFollowsTheKernel) {
  EXPECT_EQ(kOurCpuFlashMinSeq, train::kCpuFlashMinSeq);
  EXPECT_EQ(kOurFlashQueryBlock, kernels::kFlashQueryBlock);
  EXPECT_EQ(kOurFlashKeyBlock, kernels::kFlashKeyBlock);
  Job j;
  j.model = model_preset("llama3.2-1b");
  j.cluster = cluster_preset("dgx-a100");
  j.cluster.compute_units = 2;  // a CPU host: train's kernel choice
  j.gpus = 1;
  j.batch = 1;
  j.dtype = "f32";
  Layout l;
  auto activations = [&](int64_t seq, bool fused) {
    j.seq = seq;
    j.model.seq = seq;
    l.fused_attention = fused;
    return memory_per_gpu(j, l).activations;
  };
  // Blockwise: twice the sequence, twice the activations (to the per-sequence constants).
  EXPECT_NEAR(activations(8192, true) / activations(4096, true), 2.0, 1e-3);
  // The unfused kernel (train --attention naive) keeps the probabilities: about 4x.
  EXPECT_GT(activations(8192, false) / activations(4096, false), 3.0);
  // Below kCpuFlashMinSeq the runtime's auto runs the T x T kernel: the same as unfused.
  EXPECT_EQ(activations(512, true), activations(512, false));
}

// A host whose calibration timed our blockwise kernel (calibrate: its rate by the length of a
// call): a cp rank's attention is its causal share of the T×T FLOPs at the rate of calls as
// long as its pieces, 2·cp chunks of S/2cp under the ring and the all-gather, the whole
// sequence under a2a; backward 2.5x the FLOPs at the backward rate. Rates an octave apart:
// a rate looked up at the wrong length fails by 2x. Without the calibration the block GEMMs
// at the curve's rate (a different figure).
TEST(PlanContextParallel, OurCalibratedAttentionCostsEachPieceAtItsLengthsRate) {
  Job j = test::runtime_tiny_job(2);  // head dim 64, seq 128
  AttentionRates& r = j.cluster.gpu.attention;
  r.head_dim = 64;
  r.seq = {32, 64, 128};
  r.fwd_flops_per_s = {10e9, 20e9, 40e9};
  r.bwd_flops_per_s = {5e9, 10e9, 20e9};
  Layout l = layout(1, 1, 2, 0);
  l.microbatch = 16;
  const double share = 0.5, b = 16, a = 4, S = 128, s = 64, hd = 64;
  const double flops = 4 * b * a * s * S * hd / 2;
  for (const char* comm : {"ring", "all-gather"}) {
    l.cp_comm = comm;
    const LayerKernels k = layer_kernels(j, l, share);
    EXPECT_NEAR(k.attention, flops / (10e9 * share), 1e-9) << comm;  // calls of 32 = S / 2cp
    EXPECT_NEAR(k.attention_bwd, 2.5 * flops / (5e9 * share), 1e-9) << comm;
  }
  l.cp_comm = "a2a";
  const LayerKernels k = layer_kernels(j, l, share);
  EXPECT_NEAR(k.attention, flops / (40e9 * share), 1e-9);  // the whole sequence
  EXPECT_NEAR(k.attention_bwd, 2.5 * flops / (20e9 * share), 1e-9);
  j.cluster.gpu.attention = {};
  l.cp_comm = "ring";
  EXPECT_GT(std::abs(layer_kernels(j, l, share).attention / (flops / (10e9 * share)) - 1), 0.1);
}

}  // namespace
}  // namespace mt::plan

// Mixture-of-Experts in the planner: total parameters (memory) and active ones (FLOPs)
// against the published counts, the FLOPs formula, expert parallelism folded into dp × cp
// (memory per ep rank, the expert-dp reduction, the all-to-all on the fabric the ep group
// spans, the expert load), and searches that find sensible layouts for Mixtral 8x7B and
// DeepSeek-V3.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "plan/kernels.h"
#include "plan/moe.h"
#include "plan/planner.h"

namespace mt::plan {
namespace {

// Attention weights of one block: q and o of n_head·head_dim, k and v of n_kv·head_dim.
double attention(double C, double heads, double kv_heads, double head_dim) {
  return 2 * C * heads * head_dim + 2 * C * kv_heads * head_dim;
}

TEST(PlanMoe, MixtralParametersMatchThePublishedCounts) {
  // mistralai/Mixtral-8x7B: "46.7B total parameters but only uses 12.9B parameters per
  // token". The preset is Mixtral's config.json exactly, so only the published rounding
  // (3 significant digits: ±0.05B) separates them.
  const ModelSpec m = model_preset("mixtral-8x7b");
  EXPECT_EQ(m.n_experts, 8);
  EXPECT_EQ(m.moe_layers, 32);
  EXPECT_NEAR(m.total_params(), 46.7e9, 0.05e9);
  EXPECT_NEAR(m.active_params(), 12.9e9, 0.05e9);
}

TEST(PlanMoe, Qwen3ParametersMatchOnceItsHeadDimIsCounted) {
  // Qwen/Qwen3-30B-A3B: 30.5B total, 3.3B activated. Its head_dim is 128, not d_model /
  // n_head = 64 as the preset shapes attention (model/config.cpp): 48 blocks of attention
  // with 64-wide heads are 0.45B short. With that difference added back, the counts agree
  // to the published rounding (±0.05B); the preset alone is 1.5% low in total and 13% in
  // active parameters (attention is a large part of so few active ones).
  const ModelSpec m = model_preset("qwen3-30b-a3b");
  const double short_by = 48 * (attention(2048, 32, 4, 128) - attention(2048, 32, 4, 64));
  EXPECT_NEAR(short_by, 0.453e9, 0.001e9);
  EXPECT_NEAR(m.total_params() + short_by, 30.5e9, 0.05e9);
  EXPECT_NEAR(m.active_params() + short_by, 3.3e9, 0.06e9);  // 3.35B: rounds to 3.3 or 3.4
  EXPECT_LT(m.total_params(), 30.5e9 * 0.99);                // the preset's own shortfall
}

TEST(PlanMoe, DeepSeekV3ParametersWithMlaApproximated) {
  // deepseek-ai/DeepSeek-V3: 671B total (without the 14B multi-token-prediction module),
  // 37B activated. The preset shapes MLA as 128-head attention of width 7168: 205.5M
  // weights per block where MLA has 187.1M (q 7168·1536 + 1536·128·192, kv 7168·576 +
  // 512·128·256, o 128·128·7168), 1.12B more over 61 blocks. Total: 672.2B, within 0.2% of
  // 671B (the MLA difference). Active: 38.7B against "37B" (two significant digits), 4.5%
  // above: the MLA difference (1.1B) and the input embedding row (0.9B, a lookup) that the
  // published figure seems to leave out.
  const ModelSpec m = model_preset("deepseek-v3");
  EXPECT_EQ(m.moe_layers, 58);
  const double mla =
      7168.0 * 1536 + 1536.0 * 128 * 192 + 7168.0 * 576 + 512.0 * 128 * 256 + 128.0 * 128 * 7168;
  const double over = 61 * (attention(7168, 128, 128, 56) - mla);
  EXPECT_NEAR(over, 1.12e9, 0.01e9);
  EXPECT_NEAR(m.total_params() - over, 671e9, 1e9);
  EXPECT_NEAR(m.active_params(), 37e9, 0.05 * 37e9);
  EXPECT_NEAR(m.active_params() - over - double(m.vocab) * m.d_model, 37e9, 0.5e9);
}

TEST(PlanMoe, FlopsCountRouterTopKExpertsAndSharedOnly) {
  // docs/flops.md: 6·P_active + 12·L·C·T, P_active = attention + router + top_k experts +
  // shared expert per MoE block (dense MLP in the others) + LM head.
  const ModelSpec m = model_preset("deepseek-v3");
  const double C = 7168, L = 61, T = 4096;
  const double per_moe = C * 256 + 8 * 3 * C * 2048 + 3 * C * 2048;
  const double P =
      L * attention(C, 128, 128, 56) + 3 * 3 * C * 18432 + 58 * per_moe + double(m.vocab) * C;
  EXPECT_NEAR(model_flops_per_token(m, 4096) / (6 * P + 12 * L * C * T), 1.0, 1e-12);
  // A dense model is unchanged: its active width is d_ff.
  const ModelSpec d = model_preset("llama3-8b");
  EXPECT_EQ(d.active_ff(), double(d.d_ff));
  EXPECT_DOUBLE_EQ(d.active_params(), d.total_params());
}

Job mixtral_job(int64_t gpus) {
  Job j;
  j.model = model_preset("mixtral-8x7b");
  j.seq = 4096;
  j.model.seq = j.seq;
  j.batch = 256;
  j.dtype = "bf16";
  j.gpus = gpus;
  j.cluster = cluster_preset("dgx-h100");
  return j;
}

Layout layout(int dp, int tp, int pp, int ep, int zero) {
  Layout l;
  l.dp = dp, l.tp = tp, l.pp = pp, l.ep = ep, l.zero = zero;
  l.microbatch = 1;
  l.recompute = Recompute::kFull;
  return l;
}

TEST(PlanMoe, ExpertsAreShardedOverEpAndTheirStatesOverExpertDp) {
  const Job j = mixtral_job(64);
  const ModelSpec& m = j.model;
  // tp 1, pp 1: the rank holds the dense part whole and 1/ep of the experts.
  for (int ep : {1, 2, 8}) {
    SCOPED_TRACE(ep);
    const MemoryBytes mb = memory_per_gpu(j, layout(64, 1, 1, ep, 0));
    const double experts = 32 * 8 * 3 * 4096.0 * 14336;
    EXPECT_NEAR(mb.parameters, 2 * (m.total_params() - experts + experts / ep), 1e3);
    // ZeRO-1: the dense optimizer states over 64 ranks, the experts' over 64 / ep.
    const MemoryBytes z1 = memory_per_gpu(j, layout(64, 1, 1, ep, 1));
    EXPECT_NEAR(z1.optimizer, 12 * ((m.total_params() - experts) / 64 + experts / ep / (64 / ep)),
                1e3);
  }
}

TEST(PlanMoe, AllToAllCostsTheFabricTheEpGroupSpans) {
  const Job j = mixtral_job(64);
  Layout in_node = layout(64, 1, 1, 8, 1), across = layout(64, 1, 1, 8, 1);
  EXPECT_EQ(ep_per_node(j, in_node), 8);
  const Estimate a = estimate(j, in_node);
  EXPECT_GT(a.ep_comm_s, 0);
  EXPECT_EQ(estimate(j, layout(64, 1, 1, 1, 1)).ep_comm_s, 0);
  // tp 2 × ep 8 spans two nodes of 8: most of the bytes leave the node.
  across = layout(32, 2, 1, 8, 1);
  EXPECT_EQ(ep_per_node(j, across), 4);
  const double bytes = 1e8;
  EXPECT_GT(ep_all_to_all_s(j, across, bytes), 3 * ep_all_to_all_s(j, in_node, bytes));
  // Megatron-Core builds an ep group from tp-strided ranks of tp·ep neighbours, folding ep
  // over cp (initialize_model_parallel): at tp 2, cp 2, 4 of ep 8 share a node; our runtime's
  // mesh (pp, dp, ep, cp, tp) puts them cp·tp apart, 2 a node; with expert tp 1 they are
  // neighbours, all 8.
  Layout cp2 = layout(16, 2, 1, 8, 1);
  cp2.cp = 2;
  EXPECT_EQ(ep_per_node(j, cp2), 4);
  Job ours = j;
  ours.our_runtime = true;
  EXPECT_EQ(ep_per_node(ours, cp2), 2);
  Layout whole = cp2;
  whole.etp = 1;
  EXPECT_EQ(ep_per_node(j, whole), 8);
  // Exact: 7/8 of the bytes over NVLink, 7 latencies.
  EXPECT_NEAR(ep_all_to_all_s(j, in_node, bytes),
              bytes * 7 / 8 / j.cluster.intra_bytes_per_s + 7 * j.cluster.intra_latency_s, 1e-12);
  // An imbalanced router slows the experts and the busiest rank's all-to-alls.
  Job skewed = j;
  skewed.expert_load = 1.5;
  const Estimate s = estimate(skewed, in_node);
  EXPECT_GT(s.step_time_s, a.step_time_s * 1.05);
  // The bytes scale by 1.5, the latencies (7 per all-to-all) do not: between 1x and 1.5x.
  EXPECT_GT(s.ep_comm_s, a.ep_comm_s);
  EXPECT_LE(s.ep_comm_s, 1.5 * a.ep_comm_s * (1 + 1e-12));
}

TEST(PlanMoe, MegatronCoreSplitsTheExpertsOverTpAndGathersTheRoutedRows) {
  // Megatron-Core's alltoall dispatcher under tp 4 (expert tp = tp, its default): per MoE
  // block and pass, an all-gather over tp of the routed rows (top_k = 2 per token) before the
  // experts and a reduce-scatter of their outputs after, forward and backward alike, beside
  // no GEMM; SP's gather and scatter of the MLP's tokens are not there (the attention's stay).
  const Job j = mixtral_job(64);
  Layout l = layout(16, 4, 1, 8, 1);
  l.sp = true;
  l.recompute = Recompute::kNone;
  EXPECT_EQ(moe_expert_tp(j, l), 4);
  const Estimate e = estimate(j, l);
  const ClusterSpec& c = j.cluster;
  auto ring = [&](double bytes) {  // all-gather or reduce-scatter over 4 ranks in a node
    return 3.0 / 4 * bytes / c.intra_bytes_per_s + 3 * c.intra_latency_s;
  };
  const double act = 4096.0 * 4096 * 2;   // a microbatch's tokens × d_model, bf16
  const double blocks = 256 / 16 * 32.0;  // microbatches × the rank's 32 MoE blocks
  EXPECT_NEAR(e.moe_tp_comm_s, blocks * 2 * (2 * ring(2 * act)), 1e-12 * blocks);
  const double attention_sp = 2 * ring(act);  // SP's all-gather + reduce-scatter, attention
  const double qkv = layer_kernels(j, e.layout, 1).qkv;
  const double bwd = e.layout.tp_overlap ? std::max(0.0, attention_sp - qkv) : attention_sp;
  EXPECT_NEAR(e.tp_comm_s, blocks * (attention_sp + bwd), 1e-12 * blocks);
  // Memory: a rank holds 1/(ep·tp) of the routed experts (1/ep with experts whole).
  const ModelSpec& m = j.model;
  const double experts = 8 * 3 * 4096.0 * 14336;  // one block's
  EXPECT_NEAR(m.block_params_per_tp(4, 8, false, 1) - m.block_params_per_tp(4, 8, false, 4),
              experts / 8 - experts / 32, 1e-6);
  const double psi = 32 * m.block_params_per_tp(4, 8, false, 4) + m.embedding_params_per_tp(4) +
                     m.head_params_per_tp(4);
  EXPECT_NEAR(memory_per_gpu(j, l).parameters, 2 * psi, 1e3);
  // tp 1: no expert tp. Our runtime keeps the experts whole on every tp rank: none either.
  EXPECT_EQ(estimate(j, layout(64, 1, 1, 8, 1)).moe_tp_comm_s, 0);
  Job ours = j;
  ours.our_runtime = true;
  EXPECT_EQ(moe_expert_tp(ours, l), 1);
  EXPECT_EQ(estimate(ours, l).moe_tp_comm_s, 0);
}

TEST(PlanMoe, ExpertTp1KeepsTheExpertsWholeAndReducesThemOverTheTpRanksToo) {
  // Megatron-Core's --expert-tensor-parallel-size 1 under tp 4 (Layout::etp 1): no gather
  // or scatter of the routed rows; each rank holds its ep rank's experts whole, as its 3 tp
  // partners do, so the experts' states shard over tp·dp·cp / ep = 8 ranks, not 2.
  const Job j = mixtral_job(64);
  Layout split = layout(16, 4, 1, 8, 1);
  split.sp = true;
  split.recompute = Recompute::kNone;
  Layout whole = split;
  whole.etp = 1;
  EXPECT_EQ(moe_expert_tp(j, split), 4);
  EXPECT_EQ(moe_expert_tp(j, whole), 1);
  EXPECT_EQ(expert_dp(j, split), 2);
  EXPECT_EQ(expert_dp(j, whole), 8);
  const Estimate a = estimate(j, split), b = estimate(j, whole);
  EXPECT_GT(a.moe_tp_comm_s, 0);
  EXPECT_EQ(b.moe_tp_comm_s, 0);
  EXPECT_DOUBLE_EQ(b.tp_comm_s, a.tp_comm_s);  // the attention's SP collectives, in both
  const double experts = 32 * 8 * 3 * 4096.0 * 14336;
  EXPECT_NEAR(b.memory.parameters - a.memory.parameters, 2 * (experts / 8 - experts / 32), 1e3);
  // ZeRO-1's fp32 master and moments: experts/32 over 2 ranks or experts/8 over 8, alike.
  EXPECT_NEAR(b.memory.optimizer, a.memory.optimizer, 1e3);
  // Only 1 or tp; never above 1 where the experts are whole anyway.
  Layout two = split;
  two.etp = 2;
  auto why = invalid_reason(j, two);
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("etp 2"), std::string::npos) << *why;
  Job ours = j;
  ours.our_runtime = true;
  Layout four = split;
  four.etp = 4;
  EXPECT_FALSE(invalid_reason(j, four));
  why = invalid_reason(ours, four);
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("our runtime keeps the experts whole"), std::string::npos) << *why;
  Job dense = j;
  dense.model = model_preset("llama3-8b");
  Layout d = layout(16, 4, 1, 1, 1);
  d.etp = 1;
  why = invalid_reason(dense, d);
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("no experts to split (drop --etp)"), std::string::npos) << *why;
  // The search tries both under tp; a pin keeps one.
  SearchPins pins;
  pins.tp = 4;
  pins.ep = 2;
  bool saw_whole = false, saw_split = false;
  for (const Estimate& e : search(j, pins, 200).top) {
    saw_whole = saw_whole || e.layout.etp == 1;
    saw_split = saw_split || e.layout.etp == 0;
  }
  EXPECT_TRUE(saw_whole && saw_split);
  pins.etp = 1;
  for (const Estimate& e : search(j, pins, 20).top) EXPECT_EQ(e.layout.etp, 1);
}

TEST(PlanMoe, BadEpIsRefusedWithTheReason) {
  const Job j = mixtral_job(64);
  auto why = invalid_reason(j, layout(64, 1, 1, 16, 0));
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("does not divide the 8 experts"), std::string::npos) << *why;
  why = invalid_reason(j, layout(8, 8, 1, 16, 0));
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("does not divide dp 8"), std::string::npos) << *why;
  Job dense = j;
  dense.model = model_preset("llama3-8b");
  why = invalid_reason(dense, layout(64, 1, 1, 2, 0));
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("no experts"), std::string::npos) << *why;
}

TEST(PlanMoe, Mixtral8x7bOn64GpusPlansWithExpertParallelism) {
  const Job j = mixtral_job(64);
  const SearchResult r = search(j, SearchPins{}, 5);
  ASSERT_FALSE(r.top.empty());
  const Estimate& best = r.top[0];
  EXPECT_LE(best.memory.total(), memory_per_rank(j));
  // 46.7B parameters: without ZeRO or ep their bf16 weights, fp32 gradients and Adam states
  // (16 bytes each: 747 GB) cannot fit a rank of 80 GB at tp·pp <= 8; the best layout
  // shards experts or states.
  EXPECT_TRUE(best.layout.ep > 1 || best.layout.zero > 0 || best.layout.tp * best.layout.pp > 8);
  EXPECT_GT(best.mfu, 0.2);
  EXPECT_LT(best.mfu, 0.8);
  bool any_ep = false;
  for (const Estimate& e : r.top) any_ep = any_ep || e.layout.ep > 1;
  EXPECT_TRUE(any_ep) << "no ep > 1 among the top layouts";
}

TEST(PlanMoe, DeepSeekV3On2048H800s) {
  // H800: an H100 with NVLink cut to 400 GB/s (of the H100's 900): the dgx-h100 preset with
  // its intra-node bandwidth scaled by 400/900.
  Job j;
  j.model = model_preset("deepseek-v3");
  j.seq = 4096;
  j.batch = 15360 / 4;  // DeepSeek-V3 trained at 15360 sequences; a quarter keeps this fast
  j.dtype = "bf16";
  j.gpus = 2048;
  j.cluster = cluster_preset("dgx-h100");
  j.cluster.intra_bytes_per_s *= 400.0 / 900.0;
  SearchPins pins;
  pins.pp = 16;  // DeepSeek-V3's pipeline (the paper: 16-way PP, 64-way EP, ZeRO-1)
  pins.tp = 1;
  const SearchResult r = search(j, pins, 3);
  ASSERT_FALSE(r.top.empty());
  const Estimate& best = r.top[0];
  EXPECT_LE(best.memory.total(), memory_per_rank(j));
  EXPECT_GT(best.layout.ep, 1);
  EXPECT_GT(best.ep_comm_s, 0);
}

// The busiest ep rank's load as its time sees it: the measured load on GPUs and where the
// ranks have a core each; on a host with more ranks than cores the excess over the mean at
// half weight (the lighter ranks wait, their cores free: a rank's cap 1/2 against its share
// 1/4). The GEMMs see the experts' width scaled by that load.
TEST(PlanMoe, ExcessLoadOnASharedHostRunsOnTheWaitingRanksCores) {
  Job j = mixtral_job(4);
  j.expert_load = 1.8;
  const Layout ep4 = layout(4, 1, 1, 4, 0);
  EXPECT_DOUBLE_EQ(compute_load(j, layout(4, 1, 1, 1, 0)), 1.0);  // no ep: no imbalance
  EXPECT_DOUBLE_EQ(compute_load(j, ep4), 1.8);                    // GPUs
  j.cluster.compute_units = 4;                                    // a core per rank
  EXPECT_DOUBLE_EQ(compute_load(j, ep4), 1.8);
  j.cluster.compute_units = 2;  // 4 ranks on 2 cores
  EXPECT_DOUBLE_EQ(compute_load(j, ep4), 1.4);
  // The view the GEMMs cost: the routed experts' width scales by the load, 1.4 not 1.8.
  EXPECT_EQ(compute_view(j, ep4).model.d_ff, std::llround(j.model.active_ff(1.4)));
  EXPECT_LT(compute_view(j, ep4).model.d_ff, std::llround(j.model.active_ff(1.8)));
}

}  // namespace
}  // namespace mt::plan

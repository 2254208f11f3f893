// The planner's mixture of experts as our runtime runs it (issue 30 item 3; docs/planner.md
// "Mixture of experts"): train's --moe-* flags reach the planner's model, every tp rank of
// our runtime routes all its tokens through whole experts, the experts' GEMMs are costed by
// their own shapes, and the runtime's own limits (ep carved from dp only) are refused as
// train refuses them. The peaks against the allocator are in plan_runtime_memory_test.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "plan/kernels.h"
#include "plan/moe.h"
#include "plan/planner.h"
#include "test_util.h"

namespace mt::plan {
namespace {

// tiny with 4 GELU experts of d_ff, top 2, in every block; f32 on a shared host of 2 cores.
Job tiny_moe(int gpus) {
  model::GptConfig g = model::preset("tiny");
  g.n_layer = 2;
  g.seq_len = 32;
  g.moe.n_experts = 4;
  g.moe.top_k = 2;
  Job j;
  j.model = from_gpt(g);
  j.cluster = cluster_preset("dgx-a100");
  j.cluster.compute_units = 2;
  j.gpus = gpus;
  j.batch = 8;
  j.seq = 32;
  j.dtype = "f32";
  return j;
}

TEST(PlanMoeRuntime, TrainsMoeFlagsReachThePlanner) {
  // `simulate --moe-experts 4 --moe-top-k 2 --ep 2` plans the model train builds from the same
  // flags: its memory is the library's for GptConfig's MoE (until 2026-11-27 the flags were
  // accepted and ignored, and --ep was refused as "no experts to split").
  const auto r = test::run_command(
      "sh -c '" + std::string(MT_BINARY) +
      " simulate --model tiny --n-layer 2 --seq 32 --moe-experts 4 --moe-top-k 2 --dp 2 --ep 2 "
      "--batch 8 --microbatch 4 --gpus 2 --cluster dgx-a100 --dtype f32 --json 2>/dev/null'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto out = nlohmann::json::parse(r.output);
  const auto& l = out["layouts"][0];
  EXPECT_EQ(l["ep"], 2);
  Job j = tiny_moe(2);
  j.cluster.compute_units = 0;  // the dgx-a100 preset as the command has it
  Layout lay;
  lay.dp = 2, lay.ep = 2, lay.microbatch = 4;
  EXPECT_DOUBLE_EQ(l["memory_bytes_per_gpu"]["total"].get<double>(),
                   memory_per_gpu(j, lay).total());
  EXPECT_DOUBLE_EQ(l["memory_bytes_per_gpu"]["parameters"].get<double>(),
                   memory_per_gpu(j, lay).parameters);
}

TEST(PlanMoeRuntime, OurTpRanksRouteEveryTokenThroughWholeExperts) {
  // docs/moe.md "Layouts": with tp every rank routes all the microbatch's tokens and holds the
  // experts whole, so the experts' GEMMs do not shrink with tp (Megatron-Core's routes the
  // sequence-parallel shard: half of them at tp 2). Attention's GEMMs do shrink.
  const Job j = tiny_moe(2);
  Layout one, two;
  one.microbatch = two.microbatch = 8;
  two.tp = 2;
  const LayerKernels a = layer_kernels(j, one, 0.5), b = layer_kernels(j, two, 0.5);
  EXPECT_DOUBLE_EQ(b.mlp_in, a.mlp_in);
  EXPECT_DOUBLE_EQ(b.mlp_out, a.mlp_out);
  EXPECT_LT(b.qkv, a.qkv);
  // The all-to-all carries every token too: the same bytes at tp 2 as at tp 1.
  Job four = tiny_moe(4);
  Layout ep1, ep2;
  ep1.dp = ep2.dp = 2;
  ep1.ep = ep2.ep = 2;
  ep1.microbatch = ep2.microbatch = 4;
  ep2.tp = 2;
  EXPECT_DOUBLE_EQ(ep_costs(four, ep2).fwd, ep_costs(four, ep1).fwd);
}

TEST(PlanMoeRuntime, ExpertGemmsAreCostedByTheirShape) {
  // Each expert is a GEMM of its own rows (ep·n·k/E), so spreading the experts over more ep
  // ranks (more rows each, fewer experts) runs the same FLOPs at a better rate; a dense MLP of
  // the width a token passes through (k·F), the planner's view before, is faster still.
  Job j;
  j.model = model_preset("mixtral-8x7b");
  j.seq = j.model.seq = 4096;
  j.batch = 64;
  j.dtype = "bf16";
  j.gpus = 64;
  j.cluster = cluster_preset("dgx-h100");
  Layout l1, l8;
  l1.dp = l8.dp = 64;
  l1.microbatch = l8.microbatch = 1;
  l8.ep = 8;
  const LayerKernels k1 = layer_kernels(j, l1, 1.0), k8 = layer_kernels(j, l8, 1.0);
  EXPECT_GT(k1.mlp_in, k8.mlp_in);
  EXPECT_GT(k1.mlp_out, k8.mlp_out);
  const Job dense = compute_view(j, l1);  // the dense view: d_ff = k·F + the router's width
  const LayerKernels kd = layer_kernels(dense, l1, 1.0);
  EXPECT_LT(kd.mlp_in, k1.mlp_in);
  // The token copies of dispatch and combine are costed (they were not).
  EXPECT_GT(k1.moe_copy, 0.0);
  EXPECT_EQ(kd.moe_copy, 0.0);
}

TEST(PlanMoeRuntime, EpComesFromDpOnlyAsTrainRequires) {
  // train: "ep divides dp" (docs/moe.md); Megatron-Core folds ep into dp × cp.
  Job j = tiny_moe(4);
  Layout l;
  l.cp = 2, l.dp = 2, l.ep = 4, l.microbatch = 4;
  const auto why = invalid_reason(j, l);
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("ep 4 does not divide dp 2"), std::string::npos) << *why;
}

}  // namespace
}  // namespace mt::plan

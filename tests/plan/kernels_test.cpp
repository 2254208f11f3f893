// Kernel costs by kind (plan/kernels.h): the fused-attention table, the per-kernel launch
// floor, and the cluster file fields that carry them (gpu.attention, kernel_launch_s,
// sources).
#include "plan/kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/error.h"
#include "plan/planner.h"
#include "plan_test_util.h"

namespace mt::plan {
namespace {

Job llama8b(int64_t seq) {
  Job j;
  j.model = model_preset("llama3-8b");
  j.cluster = cluster_preset("dgx-h100");
  j.cluster.gpu.attention = h100_cudnn_attention();
  j.gpus = 8;
  j.batch = 8;
  j.seq = seq;
  j.model.seq = seq;
  j.dtype = "bf16";
  return j;
}

Layout one_gpu() {
  Layout l;
  l.dp = 8;
  l.microbatch = 1;
  set_software(l, Software::kToday);
  return l;
}

TEST(PlanKernels, FusedAttentionTakesTheTablesRateForHalfTheSquare) {
  // 8192 is a table point (cuDNN causal forward 529, backward 518 TFLOP/s at head dim 128):
  // forward = 2·s²·d·heads FLOPs (half of 4·s²·d) at 529e12; backward 2.5× those at 518e12.
  const Job j = llama8b(8192);
  const LayerKernels k = layer_kernels(j, one_gpu(), 1.0);
  const double s = 8192, heads = double(j.model.n_head), d = 128;
  const double flops = 4 * s * s * d * heads / 2;
  EXPECT_NEAR(k.attention, flops / 529e12, 1e-12);
  EXPECT_NEAR(k.attention_bwd, 2.5 * flops / 518e12, 1e-12);
  // Between points: linear in log2(s) (6144: halfway between 4096's 518 and 8192's 529 in
  // log2 is 0.585 of the way).
  const double w = std::log2(6144.0 / 4096);
  EXPECT_NEAR(AttentionRates::at(j.cluster.gpu.attention.seq,
                                 j.cluster.gpu.attention.fwd_flops_per_s, 6144),
              518e12 + w * 11e12, 1e3);
  // Without the table the same attention is the full T×T on the GEMM curve.
  Job curve = j;
  curve.cluster.gpu.attention = AttentionRates{};
  const LayerKernels c = layer_kernels(curve, one_gpu(), 1.0);
  EXPECT_GT(c.attention, 1.5 * k.attention);
  EXPECT_DOUBLE_EQ(c.attention_bwd, 2 * c.attention);
}

TEST(PlanKernels, OtherHeadDimensionsScaleAsTheCurvesInnerDimension) {
  // Head dim 64 (64 heads of the 8B's 4096): rate × (1 + 64/128) / (1 + 64/64) = 0.75.
  Job j = llama8b(8192);
  j.model.n_head = 64;
  const LayerKernels k = layer_kernels(j, one_gpu(), 1.0);
  const double flops = 4 * 8192.0 * 8192.0 * 64 * 64 / 2;
  EXPECT_NEAR(k.attention, flops / (529e12 * 0.75), 1e-12);
}

TEST(PlanKernels, NoKernelIsShorterThanALaunchOnAGpu) {
  // A tiny model's GEMMs take less than 4 µs of FLOPs on an H100: each costs the launch.
  Job j = llama8b(16);
  j.model.d_model = 64, j.model.n_head = 1, j.model.n_kv_head = 1, j.model.d_ff = 128;
  const LayerKernels k = layer_kernels(j, one_gpu(), 1.0);
  EXPECT_DOUBLE_EQ(k.qkv, j.cluster.gpu.kernel_launch_s);
  EXPECT_DOUBLE_EQ(k.norm_residual, 4 * j.cluster.gpu.kernel_launch_s);
  // A shared host runs its kernels as calls on the cores: no launch floor there.
  Job host = test::runtime_tiny_job(2);
  host.cluster.gpu.kernel_launch_s = 1.0;  // would dominate if applied
  const LayerKernels h = layer_kernels(host, one_gpu(), 0.5);
  EXPECT_LT(h.qkv, 0.1);
}

TEST(PlanKernels, ClusterFilesCarryTheTableTheLaunchAndTheSources) {
  ClusterSpec c = cluster_preset("dgx-h100");
  c.gpu.attention = h100_cudnn_attention();
  const ClusterSpec back = cluster_from_json(to_json(c));
  EXPECT_EQ(back.gpu.attention.seq, c.gpu.attention.seq);
  EXPECT_EQ(back.gpu.attention.bwd_flops_per_s, c.gpu.attention.bwd_flops_per_s);
  EXPECT_EQ(back.gpu.kernel_launch_s, c.gpu.kernel_launch_s);
  EXPECT_EQ(back.gpu.sources.at("attention"), c.gpu.sources.at("attention"));
  // Every preset says where each of its kernel numbers comes from.
  for (const char* name : {"dgx-a100", "dgx-h100", "hgx-b200"})
    for (const char* field : {"gemm", "hbm_efficiency", "attention", "kernel_launch_s"})
      EXPECT_TRUE(cluster_preset(name).gpu.sources.count(field)) << name << " " << field;
}

TEST(PlanKernels, AMalformedAttentionTableIsRefusedByName) {
  auto refused = [](nlohmann::json j, const std::string& what) {
    try {
      cluster_from_json(j);
      ADD_FAILURE() << "accepted: " << j.dump();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  ClusterSpec c = cluster_preset("dgx-h100");
  c.gpu.attention = h100_cudnn_attention();
  nlohmann::json j = to_json(c);
  j["gpu"]["attention"]["bwd_flops_per_s"].erase(0);
  refused(j, "gpu.attention has 6 sequence lengths, 6 forward and 5 backward rates");
  j = to_json(c);
  j["gpu"]["attention"]["seq"][2] = 100;
  refused(j, "gpu.attention.seq must ascend");
  j = to_json(c);
  j["gpu"]["attention"]["fwd_flops_per_s"][0] = -1;
  refused(j, "gpu.attention.fwd_flops_per_s[]");
  j = to_json(c);
  j["gpu"]["kernel_launch_s"] = -1e-6;
  refused(j, "gpu.kernel_launch_s");
}

}  // namespace
}  // namespace mt::plan

// Kernel costs by kind (plan/kernels.h): the fused-attention table, the per-kernel launch
// floor, and the cluster file fields that carry them (gpu.attention, kernel_launch_s,
// sources).
#include "plan/kernels.h"

#include <gtest/gtest.h>

#include <array>
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

// A cluster file cluster_from_json must refuse with a message containing `what`.
void refused(const nlohmann::json& j, const std::string& what) {
  try {
    cluster_from_json(j);
    ADD_FAILURE() << "accepted: " << j.dump();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(PlanKernels, AMalformedAttentionTableIsRefusedByName) {
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

// A 2 x 2 x 2 table whose efficiency is a known function of the grid point, so every
// interpolated value has a closed form.
GemmTable two_point_table() {
  GemmTable t;
  t.m = {1024, 4096};
  t.n = {256, 1024};
  t.k = {512, 2048};
  for (double m : t.m)
    for (double n : t.n)
      for (double k : t.k)
        t.efficiency.push_back(0.1 * std::log2(m / 512) + 0.05 * std::log2(n / 128) +
                               0.02 * std::log2(k / 256));
  return t;
}

TEST(PlanKernels, AGemmTableInterpolatesInLogShapeAndHoldsTimeBelowItsGrid) {
  const GemmTable t = two_point_table();
  auto f = [](double m, double n, double k) {  // the function the corners sample
    return 0.1 * std::log2(m / 512) + 0.05 * std::log2(n / 128) + 0.02 * std::log2(k / 256);
  };
  // Grid points exactly; between them trilinear in log2 (exact for a function linear in the
  // logs); above the grid held at the edge.
  EXPECT_NEAR(t.at(4096, 256, 2048), f(4096, 256, 2048), 1e-15);
  EXPECT_NEAR(t.at(2048, 512, 1024), f(2048, 512, 1024), 1e-15);
  EXPECT_NEAR(t.at(3000, 700, 900), f(3000, 700, 900), 1e-15);
  EXPECT_NEAR(t.at(1e6, 512, 1024), f(4096, 512, 1024), 1e-15);
  // Below the smallest m the GEMM takes the m = 1024 one's time: efficiency x m / 1024.
  EXPECT_NEAR(t.at(256, 256, 512), f(1024, 256, 512) * 256 / 1024, 1e-15);
  EXPECT_NEAR(t.at(256, 64, 512), f(1024, 256, 512) * (256.0 / 1024) * (64.0 / 256), 1e-15);
}

TEST(PlanKernels, AMeasuredGemmTableReplacesTheCurveForItsDtypeOnly) {
  Job j = llama8b(4096);
  const Layout l = one_gpu();
  const LayerKernels curve = layer_kernels(j, l, 1.0);
  j.cluster.gpu.gemm_table = two_point_table();
  const LayerKernels table = layer_kernels(j, l, 1.0);
  // The qkv GEMM [n, h + 2 kv] x [h] of one microbatch: n = 4096 tokens, N = 4096 + 2 * 1024,
  // K = 4096: above the grid on every side, so the corner (4096, 1024, 2048).
  const double n = 4096, N = 4096 + 2 * 1024, K = 4096;
  const double e = 0.1 * std::log2(8.0) + 0.05 * std::log2(8.0) + 0.02 * std::log2(8.0);
  EXPECT_NEAR(table.qkv, 2 * n * N * K / (j.cluster.gpu.peak_flops_bf16 * e), 1e-12);
  EXPECT_NE(table.qkv, curve.qkv);
  // An f32 job keeps the curve: the table was measured in bf16.
  j.dtype = "f32";
  Job f32 = j;
  f32.cluster.gpu.gemm_table = GemmTable{};
  EXPECT_DOUBLE_EQ(layer_kernels(j, l, 1.0).qkv, layer_kernels(f32, l, 1.0).qkv);
}

TEST(PlanKernels, AGemmTableTravelsInTheClusterFileAndAMalformedOneIsRefused) {
  ClusterSpec c = cluster_preset("dgx-h100");
  c.gpu.gemm_table = two_point_table();
  const ClusterSpec back = cluster_from_json(to_json(c));
  EXPECT_EQ(back.gpu.gemm_table.efficiency, c.gpu.gemm_table.efficiency);
  EXPECT_EQ(back.gpu.gemm_table.k, c.gpu.gemm_table.k);
  nlohmann::json j = to_json(c);
  j["gpu"]["gemm_table"]["efficiency"].erase(0);
  refused(j, "gpu.gemm_table has 2 x 2 x 2 grid points but 7 efficiencies");
  j = to_json(c);
  j["gpu"]["gemm_table"]["n"] = {1024, 256};
  refused(j, "gpu.gemm_table.n must ascend");
  j = to_json(c);
  j["gpu"]["gemm_table"]["efficiency"][3] = 1.5;
  refused(j, "gpu.gemm_table.efficiency holds 1.5");
  j = to_json(c);
  j["gpu"]["gemm_table"]["dtype"] = "fp8";
  refused(j, "gpu.gemm_table.dtype is \"fp8\"");
}

TEST(PlanKernels, TheCurveFitRecoversTheCurveItsPointsCameFrom) {
  const GemmCurve truth{0.71, 88};
  std::vector<std::array<double, 4>> points;
  for (double m : {128.0, 1024.0, 8192.0})
    for (double n : {64.0, 512.0, 4096.0})
      for (double k : {256.0, 2048.0}) points.push_back({m, n, k, truth.efficiency(m, n, k)});
  const GemmCurve fit = fit_gemm_curve(points);
  EXPECT_NEAR(fit.eff_max, 0.71, 1e-9);
  EXPECT_NEAR(fit.d0, 88, 1e-9);
}

}  // namespace
}  // namespace mt::plan

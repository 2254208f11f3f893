// `meshtrain calibrate --device cuda`: measures one GPU of this machine as a planner cluster
// file. Per field (and written into the file's `sources`): the bf16 GEMM efficiency on a grid
// of (m, n, k) shapes (the table the planner reads instead of its one-curve model), a curve
// fitted to that table, our elementwise kernels' memory bandwidth against the data sheet's,
// our fused attention's rate by sequence length, and the launch floor of a kernel. The links
// between GPUs cannot be measured on one GPU: they are the named preset's, and the file says
// so.
#include "cli/calibrate_gpu.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "core/write_file.h"
#include "plan/hardware.h"
#include "train/output_paths.h"
#if MESHTRAIN_CUDA
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/kernels_cuda.h"
#endif

namespace mt::cli {

namespace {

#if MESHTRAIN_CUDA

// The data sheet's dense bf16 tensor-core peak of the GPUs the planner has presets for, by
// name: MFU and the table's efficiencies are fractions of it. 0: not known (the measured
// 8192^3 rate then stands for the peak, and the file says so).
double datasheet_bf16_peak(const std::string& name) {
  auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  if (has("H100") && has("PCIe")) return 756e12;
  if (has("H100") || has("H200") || has("H800") || has("GH200")) return 989.4e12;
  if (has("A100") || has("A800")) return 312e12;
  if (has("B200")) return 2.25e15;
  return 0;
}

// The preset whose links stand in for the ones one GPU cannot measure.
std::string default_links_preset(const kernels::cuda::GpuInfo& g) {
  if (g.cc_major == 8) return "dgx-a100";
  if (g.cc_major >= 10) return "hgx-b200";
  return "dgx-h100";
}

std::vector<double> grid(bool quick) {
  if (quick) return {256, 1024, 4096};
  std::vector<double> g;
  for (double x = 64; x <= 32768; x *= 2) g.push_back(x);
  return g;
}

plan::ClusterSpec measure_gpu(bool quick, const std::string& links_from, double sustain_s) {
  namespace kc = kernels::cuda;
  device::use_cuda(0);
  const kc::GpuInfo info = kc::gpu_info();
  std::fprintf(
      stderr, "%s\n",
      fmt::format("gpu: {} (sm_{}{}, {} SMs, {:.0f} MHz, {:.1f} GiB, data-sheet memory "
                  "bandwidth {:.2f} TB/s)",
                  info.name, info.cc_major, info.cc_minor, info.sms, info.sm_clock_hz / 1e6,
                  info.memory_bytes / (1024.0 * 1024 * 1024), info.memory_bytes_per_s / 1e12)
          .c_str());
  const std::string links = links_from.empty() ? default_links_preset(info) : links_from;
  plan::ClusterSpec c = plan::cluster_preset(links);
  c.name = "this-gpu";
  plan::GpuSpec& g = c.gpu;
  g = plan::GpuSpec{};
  g.name = info.name;
  g.hbm_bytes = info.memory_bytes;
  const int reps = quick ? 2 : 5;

  const double square_bf16 = kc::time_gemm_flops(8192, true, reps);
  g.peak_flops_f32 = kc::time_gemm_flops(quick ? 2048 : 8192, false, reps);
  const double sheet = datasheet_bf16_peak(info.name);
  g.peak_flops_bf16 = sheet > 0 ? sheet : square_bf16;
  g.sources["peak_flops_bf16"] =
      sheet > 0 ? fmt::format("data sheet of the {} (dense bf16)", info.name)
                : fmt::format("measured: an 8192^3 bf16 GEMM ({} has no data-sheet peak here)",
                              info.name);
  g.sources["peak_flops_f32"] = "measured: an 8192^3 f32 GEMM (true f32, no TF32)";
  std::fprintf(stderr, "%s\n",
               fmt::format("gemm bf16 8192^3: {:.0f} TFLOP/s ({:.1f}% of the peak {:.0f}); f32: "
                           "{:.1f} TFLOP/s",
                           square_bf16 / 1e12, 100 * square_bf16 / g.peak_flops_bf16,
                           g.peak_flops_bf16 / 1e12, g.peak_flops_f32 / 1e12)
                   .c_str());

  // The bf16 table over every (m, n, k) of the grid, and the curve fitted to it.
  plan::GemmTable& t = g.gemm_table;
  t.dtype = "bf16";
  t.m = t.n = t.k = grid(quick);
  const std::vector<double> rates = kc::time_gemm_table(t.m, t.n, t.k, reps);
  std::vector<std::array<double, 4>> points;
  for (size_t i = 0; i < rates.size(); ++i) {
    const double e = std::min(1.0, rates[i] / g.peak_flops_bf16);
    t.efficiency.push_back(e);
    const size_t nk = t.k.size(), nn = t.n.size();
    points.push_back({t.m[i / (nn * nk)], t.n[(i / nk) % nn], t.k[i % nk], e});
  }
  g.gemm = plan::fit_gemm_curve(points);
  g.sources["gemm_table"] = fmt::format(
      "measured: cuBLASLt bf16 (f32 accumulate and output) C = A B^T on {0} x {0} x {0} shapes "
      "{1:.0f}..{2:.0f}, median of {3} batches",
      t.m.size(), t.m.front(), t.m.back(), reps);
  g.sources["gemm"] = "fitted (least squares on log efficiency) to the measured gemm_table";
  // The table's rates are bursts; a training run holds the card at its power limit.
  if (sustain_s > 0) {
    const kc::SustainedRate su = kc::time_gemm_sustained(quick ? 2048 : 8192, sustain_s);
    g.compute_sustain = std::min(1.0, su.sustained_flops_per_s / su.burst_flops_per_s);
    g.sources["compute_sustain"] = fmt::format(
        "measured: an 8192^3 bf16 GEMM back to back for {:.0f} s, the last half's median rate "
        "{:.0f} TFLOP/s over its burst rate {:.0f} TFLOP/s",
        sustain_s, su.sustained_flops_per_s / 1e12, su.burst_flops_per_s / 1e12);
    std::fprintf(stderr, "%s\n",
                 fmt::format("sustained: {:.0f} TFLOP/s after {:.0f} s against {:.0f} burst: "
                             "compute_sustain {:.3f}",
                             su.sustained_flops_per_s / 1e12, sustain_s,
                             su.burst_flops_per_s / 1e12, g.compute_sustain)
                     .c_str());
  } else {
    g.sources["compute_sustain"] = "not measured (--sustain-seconds 0): burst rates as they are";
  }
  // A slice a person can read: m = 8192 tokens, n x k.
  {
    const size_t mi = std::min<size_t>(t.m.size() - 1, quick ? 2 : 7);
    std::string head =
        fmt::format("gemm efficiency at m = {:.0f} (rows n, columns k):\n  n\\k  ", t.m[mi]);
    for (double k : t.k) head += fmt::format("{:>6.0f}", k);
    std::fprintf(stderr, "%s\n", head.c_str());
    for (size_t j = 0; j < t.n.size(); ++j) {
      std::string row = fmt::format("{:>6.0f}", t.n[j]);
      for (size_t l = 0; l < t.k.size(); ++l)
        row += fmt::format("{:>6.2f}", t.efficiency[(mi * t.n.size() + j) * t.k.size() + l]);
      std::fprintf(stderr, "%s\n", row.c_str());
    }
    std::fprintf(
        stderr, "%s\n",
        fmt::format("fitted curve: eff_max {:.2f}, d0 {:.0f}", g.gemm.eff_max, g.gemm.d0).c_str());
  }

  // Memory-bound kernels: our elementwise add (two reads, one write) is what the trainer's
  // norms, activations and optimizer look like; the copy beside it for reference.
  const int64_t mem_bytes = quick ? (int64_t{64} << 20) : (int64_t{1} << 30);
  const kc::MemoryRates mem = kc::time_memory_rates(mem_bytes, reps);
  g.hbm_bytes_per_s = info.memory_bytes_per_s > 0 ? info.memory_bytes_per_s : mem.copy_bytes_per_s;
  g.hbm_efficiency = std::min(1.0, mem.add_bytes_per_s / g.hbm_bytes_per_s);
  g.sources["hbm_bytes_per_s"] =
      "data sheet: memory clock x 2 x bus width (cudaDeviceGetAttribute)";
  g.sources["hbm_efficiency"] = fmt::format(
      "measured: our elementwise add (2 reads + 1 write) over {} MiB arrays / hbm_bytes_per_s",
      mem_bytes >> 20);
  std::fprintf(stderr, "%s\n",
               fmt::format("memory: add {:.2f} TB/s, copy {:.2f} TB/s; efficiency {:.2f} of "
                           "{:.2f} TB/s",
                           mem.add_bytes_per_s / 1e12, mem.copy_bytes_per_s / 1e12,
                           g.hbm_efficiency, g.hbm_bytes_per_s / 1e12)
                   .c_str());

  // The launch floor: the GPU's time per empty kernel back to back, or the host's per
  // launch, whichever is longer (a host that launches slower than the GPU runs starves it).
  const kc::LaunchTimes launch = kc::time_launches(quick ? 200 : 5000);
  g.kernel_launch_s = std::max(launch.gpu_s, launch.host_s);
  g.kernel_overhead_s = 0;
  g.sources["kernel_launch_s"] = fmt::format(
      "measured: max(GPU time per empty kernel back to back {:.2f} us, host time per launch "
      "{:.2f} us)",
      launch.gpu_s * 1e6, launch.host_s * 1e6);
  std::fprintf(stderr, "%s\n",
               fmt::format("launch: {:.2f} us per kernel on the GPU, {:.2f} us per launch on the "
                           "host",
                           launch.gpu_s * 1e6, launch.host_s * 1e6)
                   .c_str());

  // Our fused attention at head dim 128, 16 heads, 16K tokens per call, causal: FLOPs
  // counted as the published kernel tables count them (forward 4·T²·d/2 per head and
  // sequence, backward 2.5x).
  const int64_t hd = 128, heads = 16, C = hd * heads;
  g.attention.head_dim = static_cast<int>(hd);
  for (int64_t T = 512;
       T <= std::min<int64_t>(quick ? 1024 : 16384, kc::detail::flash_attention_max_T()); T *= 2) {
    const int64_t B = std::max<int64_t>(1, 16384 / T);
    const kc::AttentionTimes a = kc::time_flash_attention(B, T, C, heads, reps);
    const double flops = 4.0 * B * heads * double(T) * T * hd / 2;
    g.attention.seq.push_back(double(T));
    g.attention.fwd_flops_per_s.push_back(flops / a.forward_s);
    g.attention.bwd_flops_per_s.push_back(2.5 * flops / a.backward_s);
    std::fprintf(stderr, "%s\n",
                 fmt::format("attention T {:>5} (B {:>2}): forward {:.0f} TFLOP/s, backward {:.0f} "
                             "TFLOP/s",
                             T, B, flops / a.forward_s / 1e12, 2.5 * flops / a.backward_s / 1e12)
                     .c_str());
  }
  g.sources["attention"] =
      "measured: meshtrain's fused (flash) attention, bf16 tensor cores, head dim 128, causal";
  g.sources["links"] =
      fmt::format("the {} preset's (one GPU cannot measure NVLink or the network)", links);
  return c;
}

#endif

}  // namespace

void run_calibrate_gpu(const std::string& out_path, bool quick, const std::string& links_from,
                       double sustain_s) {
#if MESHTRAIN_CUDA
  if (device::cuda_device_count() < 1)
    fail(
        "calibrate --device cuda: no GPU is visible (cuda_device_count() is 0); run it on the "
        "machine whose GPU the planner should know, or plan with a preset (--cluster dgx-a100, "
        "dgx-h100, hgx-b200)");
  if (const auto dir = std::filesystem::path(out_path).parent_path(); !dir.empty())
    train::check_output_dir(dir.string(), "--out");
  train::check_output_file(out_path, "--out");
  const plan::ClusterSpec c = measure_gpu(quick, links_from, sustain_s);
  plan::validate(c);
  if (const auto dir = std::filesystem::path(out_path).parent_path(); !dir.empty())
    std::filesystem::create_directories(dir);
  io::write_file(out_path, plan::to_json(c).dump(2) + "\n");
  std::printf("wrote %s (plan with --cluster %s)\n", out_path.c_str(), out_path.c_str());
#else
  (void)out_path, (void)quick, (void)links_from, (void)sustain_s;
  fail(
      "calibrate --device cuda: this meshtrain was built without CUDA; rebuild with "
      "-DMESHTRAIN_CUDA=ON (nvcc found), or plan with a preset (--cluster dgx-a100, dgx-h100, "
      "hgx-b200)");
#endif
}

}  // namespace mt::cli

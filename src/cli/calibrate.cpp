// `meshtrain calibrate`: measures this host as the planner's `this-host` cluster: the GEMM
// rate by shape and dtype (fitting the one-curve-per-device efficiency model of
// plan/hardware.h), memory bandwidth, and the local backend's all-reduce latency and bus
// bandwidth. Writes the preset (default plan::this_host_path()).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "cli/commands.h"
#include "comm/launch.h"
#include "core/error.h"
#include "kernels/kernels.h"
#include "kernels/peak.h"
#include "plan/hardware.h"

namespace mt::cli {

namespace {

struct Shape {
  int64_t m, n, k;
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Best-of-3 copy bandwidth over 64 MiB (read + write bytes).
double memory_bandwidth() {
  const size_t n = 16u << 20;
  std::vector<float> a(n, 1.0f), b(n, 0.0f);
  double best = 0;
  for (int rep = 0; rep < 4; ++rep) {
    const double t0 = now_s();
    std::copy(a.begin(), a.end(), b.begin());
    const double dt = now_s() - t0;
    if (rep > 0) best = std::max(best, 2.0 * n * sizeof(float) / dt);
    a[rep] = b[n - 1 - rep];
  }
  return best;
}

// Bus bandwidth and latency of the local backend's all_reduce over `ranks` threads: the
// time of a small message gives alpha, the large one the bandwidth (alpha-beta model).
std::pair<double, double> allreduce_alpha_beta(int ranks) {
  const int64_t small = 256, large = 8 << 20;  // floats
  double t_small = 0, t_large = 0;
  comm::LaunchOptions lo;
  lo.backend = comm::BackendKind::kLocal;
  lo.world_size = ranks;
  lo.timeout_s = 120;
  comm::launch(lo, [&](comm::Group& world) {
    std::vector<float> buf(large, 1.0f);
    auto time_it = [&](int64_t elems, int reps) {
      world.barrier();
      double best = 1e30;
      for (int r = 0; r < reps; ++r) {
        world.barrier();
        const double t0 = now_s();
        world.all_reduce(comm::Buf(buf.data(), elems));
        best = std::min(best, now_s() - t0);
      }
      return best;
    };
    const double s = time_it(small, 20), l = time_it(large, 4);
    if (world.rank() == 0) t_small = s, t_large = l;
  });
  const double factor = 2.0 * (ranks - 1);
  const double alpha = t_small / factor;
  const double busbw = factor / ranks * large * 4.0 / std::max(1e-9, t_large - factor * alpha);
  return {alpha, busbw};
}

void run_calibrate(const std::string& out_path, bool quick) {
  const int cores = kernels::host_cores();
  kernels::set_threads(cores);
  plan::ClusterSpec c;
  c.name = "this-host";
  c.gpu.name = fmt::format("cpu ({} cores)", cores);
  c.compute_units = cores;
  c.gpus_per_node = 1024;  // every rank of the local backend shares one host
  const int reps = quick ? 2 : 3;
  // Peaks: a large square GEMM.
  const int64_t big = quick ? 768 : 1536;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const double peak = kernels::time_gemm_flops(dt, false, false, big, big, big, reps);
    (dt == DType::kF32 ? c.gpu.peak_flops_f32 : c.gpu.peak_flops_bf16) = peak;
    std::fprintf(
        stderr, "%s\n",
        fmt::format("gemm {} {}^3: {:.1f} GFLOP/s", dtype_name(dt), big, peak / 1e9).c_str());
  }
  // The shape curve (f32, the runtime's dtype): rate / peak over small and skinny shapes.
  std::vector<Shape> shapes = {{big, big, 64},  {big, 64, big},  {64, big, big}, {big, big, 128},
                               {256, 256, 256}, {128, 512, 512}, {big, 256, big}};
  std::vector<std::pair<Shape, double>> eff;
  for (const Shape& s : shapes) {
    const double r = kernels::time_gemm_flops(DType::kF32, false, false, s.m, s.n, s.k, reps);
    eff.push_back({s, r / c.gpu.peak_flops_f32});
    std::fprintf(stderr, "%s\n",
                 fmt::format("gemm f32 {}x{}x{}: {:.1f} GFLOP/s ({:.0f}% of peak)", s.m, s.n, s.k,
                             r / 1e9, 100 * r / c.gpu.peak_flops_f32)
                     .c_str());
  }
  // Fit (eff_max, d0) by least squares on log efficiency, with the square as eff_max's anchor.
  double best_err = 1e30;
  for (double em = 0.80; em <= 1.30; em += 0.01)
    for (double d0 = 0; d0 <= 256; d0 += 4) {
      plan::GemmCurve g{em, d0};
      double err = std::pow(std::log(g.efficiency(big, big, big)), 2);
      for (const auto& [s, e] : eff) err += std::pow(std::log(g.efficiency(s.m, s.n, s.k) / e), 2);
      if (err < best_err) best_err = err, c.gpu.gemm = g;
    }
  // Express the peak so that eff_max · peak is the rate of the square.
  const double square_eff = c.gpu.gemm.efficiency(big, big, big);
  c.gpu.peak_flops_f32 /= square_eff;
  c.gpu.peak_flops_bf16 /= square_eff;
  c.gpu.hbm_bytes_per_s = memory_bandwidth();
  c.gpu.hbm_efficiency = 1.0;  // measured as achieved
  c.gpu.hbm_bytes = 0;
  {
    const auto si = std::filesystem::space_info{};
    (void)si;
    std::ifstream mi("/proc/meminfo");
    std::string key;
    double kb = 0;
    while (mi >> key >> kb) {
      if (key == "MemTotal:") break;
      mi.ignore(256, '\n');
    }
    c.gpu.hbm_bytes = kb * 1024;
  }
  auto [alpha, busbw] = allreduce_alpha_beta(2);
  c.intra_latency_s = c.inter_latency_s = alpha;
  c.intra_bytes_per_s = c.inter_bytes_per_s = busbw;
  std::fprintf(stderr, "%s\n",
               fmt::format("memory copy {:.1f} GB/s; local all_reduce: alpha {:.1f} us, bus "
                           "bandwidth {:.1f} GB/s; gemm curve eff_max {:.2f}, d0 {:.0f}",
                           c.gpu.hbm_bytes_per_s / 1e9, alpha * 1e6, busbw / 1e9,
                           c.gpu.gemm.eff_max, c.gpu.gemm.d0)
                   .c_str());
  std::filesystem::create_directories(std::filesystem::path(out_path).parent_path());
  std::ofstream out(out_path);
  if (!out) fail_run("calibrate: cannot write '{}'", out_path);
  out << plan::to_json(c).dump(2) << "\n";
  std::printf("wrote %s\n", out_path.c_str());
}

}  // namespace

void register_calibrate(CLI::App& app) {
  auto out = std::make_shared<std::string>(plan::this_host_path());
  auto quick = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand(
      "calibrate", "measure this host (GEMM by shape, memory, collectives) as --cluster this-host");
  cmd->add_option("--out", *out, "where to write the preset (default: the this-host cache)");
  cmd->add_flag("--quick", *quick, "smaller shapes, fewer repetitions (tests)");
  cmd->callback([out, quick] { run_calibrate(*out, *quick); });
}

}  // namespace mt::cli

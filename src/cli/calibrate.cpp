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
  // One thread: the trainer gives each rank max(1, cores / ranks) threads, so with as many
  // ranks as cores (or more) a rank computes on one core; N ranks share the host's
  // cores · (one-core rate).
  const int cores = kernels::host_cores();
  kernels::set_threads(1);
  plan::ClusterSpec c;
  c.name = "this-host";
  c.gpu.name = fmt::format("cpu ({} cores)", cores);
  c.compute_units = cores;
  c.gpus_per_node = 1024;          // every rank of the local backend shares one host
  const int reps = quick ? 2 : 6;  // best of: the host is shared, the best run is the rate
  // Peaks: a large square GEMM.
  const int64_t big = quick ? 512 : 1024;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const double peak = kernels::time_gemm_flops(dt, false, false, big, big, big, reps);
    (dt == DType::kF32 ? c.gpu.peak_flops_f32 : c.gpu.peak_flops_bf16) = peak * cores;
    std::fprintf(
        stderr, "%s\n",
        fmt::format("gemm {} {}^3: {:.1f} GFLOP/s", dtype_name(dt), big, peak / 1e9).c_str());
  }
  // The shape curve (f32, the runtime's dtype): rate / peak over small and skinny shapes.
  // Shapes of small transformer layers (tokens x width x width, per-head attention) and
  // skinny ones.
  std::vector<Shape> shapes = {{big, 256, 256},  {big, 768, 256}, {big, 256, 1024},
                               {big, 1024, 256}, {128, 128, 64},  {128, 64, 128},
                               {big, big, 64},   {64, big, big},  {256, 256, 256}};
  std::vector<std::pair<Shape, double>> eff;
  for (const Shape& s : shapes) {
    const double r = kernels::time_gemm_flops(DType::kF32, false, false, s.m, s.n, s.k, reps);
    eff.push_back({s, r * cores / c.gpu.peak_flops_f32});
    std::fprintf(stderr, "%s\n",
                 fmt::format("gemm f32 {}x{}x{}: {:.1f} GFLOP/s", s.m, s.n, s.k, r / 1e9).c_str());
  }
  // The runtime's own linear layer (bias, transposed backward GEMMs): forward + backward of
  // tokens x in -> out, 6·n·in·out FLOPs, as (tokens, out, in) GEMM shapes of the curve.
  for (const Shape& s :
       std::vector<Shape>{{big, 768, 256}, {big, 256, 256}, {big, 1024, 256}, {big, 256, 1024}}) {
    std::vector<float> x(s.m * s.k, 0.01f), w(s.n * s.k, 0.02f), b(s.n, 0.0f), y(s.m * s.n),
        dx(s.m * s.k), dw(s.n * s.k, 0.0f), db(s.n, 0.0f);
    double best = 1e30;
    for (int rep = 0; rep <= reps; ++rep) {
      const double t0 = now_s();
      kernels::linear_forward(y.data(), x.data(), w.data(), b.data(), s.m, s.k, s.n);
      kernels::linear_backward(dx.data(), dw.data(), db.data(), y.data(), x.data(), w.data(), s.m,
                               s.k, s.n);
      if (rep > 0) best = std::min(best, now_s() - t0);
    }
    const double r = 6.0 * s.m * s.n * s.k / best;
    eff.push_back({s, r * cores / c.gpu.peak_flops_f32});
    std::fprintf(
        stderr, "%s\n",
        fmt::format("linear fwd+bwd {}x{} -> {}: {:.1f} GFLOP/s", s.m, s.k, s.n, r / 1e9).c_str());
  }
  // The peak is the best rate seen (on a busy host a skinny shape may beat the square);
  // the curve is fitted to every rate / peak, the square included, by least squares on
  // log efficiency.
  const double square = c.gpu.peak_flops_f32;
  double best_rate = square;
  for (const auto& [s, e] : eff) best_rate = std::max(best_rate, e * square);
  const double scale = square / best_rate;
  c.gpu.peak_flops_f32 = best_rate;
  c.gpu.peak_flops_bf16 /= scale;
  eff.push_back({Shape{big, big, big}, 1.0});
  for (auto& x : eff) x.second *= scale;
  double best_err = 1e30;
  for (double em = 0.30; em <= 1.001; em += 0.01)
    for (double d0 = 0; d0 <= 256; d0 += 4) {
      plan::GemmCurve g{em, d0};
      double err = 0;
      for (const auto& [s, e] : eff)
        err += std::pow(std::log(g.efficiency(double(s.m), double(s.n), double(s.k)) / e), 2);
      if (err < best_err) best_err = err, c.gpu.gemm = g;
    }
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

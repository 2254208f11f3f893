// `meshtrain calibrate`: measures this host as the planner's `this-host` cluster: the GEMM
// rate by shape and dtype (fitting the one-curve-per-device efficiency model of
// plan/hardware.h), memory bandwidth, and the all-reduce latency and bus bandwidth of the
// backend the runs will use (local rank threads, or MPI under mpirun). Writes the preset
// (default plan::this_host_path()).
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "cli/calibrate_gpu.h"
#include "cli/calibrate_hosts.h"
#include "cli/commands.h"
#include "comm/hosts.h"
#include "comm/launch.h"
#include "comm/mpi.h"
#include "core/error.h"
#include "core/write_file.h"
#include "kernels/flash_attention.h"
#include "kernels/kernels.h"
#include "kernels/peak.h"
#include "plan/hardware.h"
#include "train/output_paths.h"

namespace mt::cli {

namespace {

struct Shape {
  int64_t m, n, k;
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The best of `measure()` (a rate) over at least `min_s` seconds: on a shared host other
// processes take the cores in bursts; the best rate over a longer window is the host's own.
double best_over(double min_s, const std::function<double()>& measure) {
  const double t0 = now_s();
  double best = 0;
  do best = std::max(best, measure());
  while (now_s() - t0 < min_s);
  return best;
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

struct AlphaBeta {
  double alpha = 0, bus_bytes_per_s = 0;
};

// Latency and bus bandwidth of `world`'s all_reduce (every rank calls it): the time of a
// small message gives alpha, a large one the bandwidth (alpha-beta ring model). Best of
// several runs, as rank 0 sees them.
AlphaBeta allreduce_alpha_beta(comm::Group& world) {
  const int64_t small = 256, large = 8 << 20;  // floats
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
  const double t_small = time_it(small, 20), t_large = time_it(large, 4);
  const int ranks = world.size();
  const double factor = 2.0 * (ranks - 1);
  AlphaBeta ab;
  ab.alpha = t_small / factor;
  ab.bus_bytes_per_s = factor / ranks * large * 4.0 / std::max(1e-9, t_large - factor * ab.alpha);
  return ab;
}

// The sum over `threads` concurrent threads (one OpenMP thread each) of each one's best rate
// of `measure` over `window_s`: every core busy, as when the job's ranks all compute (a core
// alone runs faster — turbo, the whole cache and memory bus — than the training will see).
double all_cores_rate(int threads, double window_s, const std::function<double()>& measure) {
  std::vector<double> rates(static_cast<size_t>(threads), 0.0);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      kernels::set_threads(1);
      rates[static_cast<size_t>(t)] = best_over(window_s, measure);
    });
  for (std::thread& th : pool) th.join();
  double sum = 0;
  for (double r : rates) sum += r;
  return sum;
}

// The compute side of this host: GEMM peaks and shape curve, memory bandwidth, RAM, with
// every one of its `cores` busy. This process runs `threads` measuring threads; `sum_ranks`
// adds its totals to those of the other processes measuring at the same time (mpi: one
// process per bound core; local: the identity).
plan::ClusterSpec measure_host(bool quick, int cores, int threads,
                               const std::function<double(double)>& sum_ranks) {
  // One thread each: the trainer gives each rank max(1, cores / ranks) threads, so with as
  // many ranks as cores (or more) a rank computes on one core; N ranks share the host's rate.
  kernels::set_threads(1);
  plan::ClusterSpec c;
  c.name = "this-host";
  c.gpu.name = fmt::format("cpu ({} cores)", cores);
  c.compute_units = cores;
  c.gpus_per_node = 1024;          // every rank of the local backend shares one host
  const int reps = quick ? 2 : 6;  // best of: the host is shared, the best run is the rate
  const double window_s = quick ? 0.0 : 0.4;  // and each shape for at least this long
  auto host_rate = [&](const std::function<double()>& measure) {
    return sum_ranks(all_cores_rate(threads, window_s, measure));
  };
  // Peaks: a large square GEMM.
  const int64_t big = quick ? 512 : 1024;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const double peak =
        host_rate([&] { return kernels::time_gemm_flops(dt, false, false, big, big, big, reps); });
    (dt == DType::kF32 ? c.gpu.peak_flops_f32 : c.gpu.peak_flops_bf16) = peak;
    std::fprintf(stderr, "%s\n",
                 fmt::format("gemm {} {}^3: {:.1f} GFLOP/s per core, all {} busy", dtype_name(dt),
                             big, peak / cores / 1e9, cores)
                     .c_str());
  }
  // The shape curve (f32, the runtime's dtype): rate / peak over small and skinny shapes.
  // Shapes of small transformer layers (tokens x width x width, per-head attention) and
  // skinny ones.
  std::vector<Shape> shapes = {{big, 256, 256},  {big, 768, 256}, {big, 256, 1024},
                               {big, 1024, 256}, {128, 128, 64},  {128, 64, 128},
                               {big, big, 64},   {64, big, big},  {256, 256, 256}};
  std::vector<std::pair<Shape, double>> eff;
  for (const Shape& s : shapes) {
    const double r = host_rate(
        [&] { return kernels::time_gemm_flops(DType::kF32, false, false, s.m, s.n, s.k, reps); });
    eff.push_back({s, r / c.gpu.peak_flops_f32});
    std::fprintf(
        stderr, "%s\n",
        fmt::format("gemm f32 {}x{}x{}: {:.1f} GFLOP/s per core", s.m, s.n, s.k, r / cores / 1e9)
            .c_str());
  }
  // The runtime's own linear layer (bias, transposed backward GEMMs): forward + backward of
  // tokens x in -> out, 6·n·in·out FLOPs, as (tokens, out, in) GEMM shapes of the curve.
  for (const Shape& s :
       std::vector<Shape>{{big, 768, 256}, {big, 256, 256}, {big, 1024, 256}, {big, 256, 1024}}) {
    const double r = host_rate([&] {
      std::vector<float> x(s.m * s.k, 0.01f), w(s.n * s.k, 0.02f), b(s.n, 0.0f), y(s.m * s.n),
          dx(s.m * s.k), dw(s.n * s.k, 0.0f), db(s.n, 0.0f);
      double best = 0;
      for (int rep = 0; rep <= reps; ++rep) {  // the first is the warm-up
        const double t0 = now_s();
        kernels::linear_forward(y.data(), x.data(), w.data(), b.data(), s.m, s.k, s.n);
        kernels::linear_backward(dx.data(), dw.data(), db.data(), y.data(), x.data(), w.data(), s.m,
                                 s.k, s.n);
        if (rep > 0) best = std::max(best, 6.0 * s.m * s.n * s.k / (now_s() - t0));
      }
      return best;
    });
    eff.push_back({s, r / c.gpu.peak_flops_f32});
    std::fprintf(stderr, "%s\n",
                 fmt::format("linear fwd+bwd {}x{} -> {}: {:.1f} GFLOP/s per core", s.m, s.k, s.n,
                             r / cores / 1e9)
                     .c_str());
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
  std::vector<std::array<double, 4>> points;
  for (auto& x : eff) {
    x.second *= scale;
    points.push_back({double(x.first.m), double(x.first.n), double(x.first.k), x.second});
  }
  c.gpu.gemm = plan::fit_gemm_curve(points);
  // Our blockwise attention kernel (f32, head dim 64, causal), the one train runs under
  // context parallelism and at long sequences: its rate by sequence length with every core
  // busy, forward and backward, FLOPs counted as the planner counts them (4·T²·hd/2 per head
  // forward, 2.5x that backward). The kernel's softmax work inside each block pair is in the
  // rate, which the GEMM curve on the block shapes alone leaves out (bench/plan-vs-runtime:
  // the CP layouts 15-31% slower than predicted with the curve).
  {
    constexpr int64_t kHd = 64, kHeads = 4, kC = kHd * kHeads;
    plan::AttentionRates& att = c.gpu.attention;
    att.head_dim = static_cast<int>(kHd);
    const std::vector<int64_t> seqs =
        quick ? std::vector<int64_t>{128, 512}
              : std::vector<int64_t>{16, 32, 64, 128, 256, 512, 1024, 2048};
    for (const int64_t T : seqs) {
      const int64_t B = std::max<int64_t>(1, 2048 / T);  // about the same work per call
      const double flops = 4.0 * double(B * kHeads) * double(T) * double(T) * kHd / 2;
      auto rate = [&](bool backward) {
        std::vector<float> qkv(size_t(B * T * 3 * kC)), out(size_t(B * T * kC)),
            lse(size_t(B * kHeads * T)), dqkv(qkv.size()), dout(out.size(), 0.01f);
        for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = 0.01f * float(int(i % 97) - 48);
        double best = 0;
        for (int rep = 0; rep <= reps; ++rep) {  // the first is the warm-up
          const double t0 = now_s();
          if (!backward || rep == 0)
            kernels::flash_attention_forward(out.data(), lse.data(), qkv.data(), B, T, kC, kHeads);
          const double t1 = now_s();
          if (backward)
            kernels::flash_attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(),
                                              lse.data(), B, T, kC, kHeads);
          const double dt = backward ? now_s() - t1 : t1 - t0;
          if (rep > 0) best = std::max(best, (backward ? 2.5 : 1.0) * flops / dt);
        }
        return best;
      };
      att.seq.push_back(double(T));
      att.fwd_flops_per_s.push_back(host_rate([&] { return rate(false); }));
      att.bwd_flops_per_s.push_back(host_rate([&] { return rate(true); }));
      std::fprintf(stderr, "%s\n",
                   fmt::format("attention (ours, f32, head dim {}) T {}: forward {:.1f}, backward "
                               "{:.1f} GFLOP/s per core",
                               kHd, T, att.fwd_flops_per_s.back() / cores / 1e9,
                               att.bwd_flops_per_s.back() / cores / 1e9)
                       .c_str());
    }
    c.gpu.sources["attention"] =
        "calibrate: meshtrain's blockwise f32 kernel (kernels/flash_attention.h), head dim 64, "
        "causal, every core busy";
  }
  c.gpu.hbm_bytes_per_s = host_rate(memory_bandwidth);  // all cores copying at once
  c.gpu.hbm_efficiency = 1.0;                           // measured as achieved
  c.gpu.hbm_bytes = 0;
  {
    std::ifstream mi("/proc/meminfo");
    std::string key;
    double kb = 0;
    while (mi >> key >> kb) {
      if (key == "MemTotal:") break;
      mi.ignore(256, '\n');
    }
    c.gpu.hbm_bytes = kb * 1024;
    // The planner refuses a host without memory: say so here, not when the file is read.
    if (c.gpu.hbm_bytes <= 0)
      fail(
          "calibrate: cannot read MemTotal from /proc/meminfo (the host's memory, which its "
          "ranks share); run it where /proc is mounted");
  }
  return c;
}

// `links`: the all-reduce measured at one or more rank counts, ascending; the first is the
// preset's plain link (a job of that size), all go to host_links.
void report_and_write(plan::ClusterSpec c, const std::vector<plan::HostLink>& links,
                      comm::BackendKind backend, const std::string& out_path) {
  c.intra_latency_s = c.inter_latency_s = links.front().latency_s;
  c.intra_bytes_per_s = c.inter_bytes_per_s = links.front().bytes_per_s;
  c.host_links = links;
  c.backend = std::string(comm::backend_name(backend));
  std::string measured;
  for (const plan::HostLink& h : links)
    measured +=
        fmt::format("{}{} ranks: alpha {:.1f} us, bus bandwidth {:.1f} GB/s",
                    measured.empty() ? "" : "; ", h.ranks, h.latency_s * 1e6, h.bytes_per_s / 1e9);
  std::fprintf(stderr, "%s\n",
               fmt::format("memory copy {:.1f} GB/s; gemm curve eff_max {:.2f}, d0 {:.0f}; {} "
                           "all_reduce at {}",
                           c.gpu.hbm_bytes_per_s / 1e9, c.gpu.gemm.eff_max, c.gpu.gemm.d0,
                           comm::backend_name(backend), measured)
                   .c_str());
  // (a bare file name has no folder to make)
  if (const auto dir = std::filesystem::path(out_path).parent_path(); !dir.empty())
    std::filesystem::create_directories(dir);
  io::write_file(out_path, plan::to_json(c).dump(2) + "\n");
  std::printf("wrote %s\n", out_path.c_str());
}

// Under mpirun on several hosts (docs/multihost.md): the planner's nodes are the hosts. The
// all-reduce inside rank 0's host (its ranks: shared memory, every host's at once) is the
// intra-node link, the all-reduce over one rank of each host (TCP, every such group at once)
// the inter-node link, per rank as the planner's `inter_bytes_per_s`; gpus_per_node is rank 0's
// host's rank count, max_nodes the host count, inter_curve the inter-node all-reduce by size.
// No host_links: they would stand for both links.
void write_hosts(plan::ClusterSpec c, const comm::HostMap& hosts, int per_host, AlphaBeta intra,
                 AlphaBeta inter, const plan::LinkCurve& inter_curve, const std::string& out_path) {
  c.gpus_per_node = per_host;
  c.max_nodes = hosts.hosts();
  c.intra_latency_s = intra.alpha;
  c.intra_bytes_per_s = intra.bus_bytes_per_s;
  c.inter_latency_s = inter.alpha;
  c.inter_bytes_per_s = inter.bus_bytes_per_s;
  c.host_links.clear();
  c.inter_curve = inter_curve;
  c.backend = "mpi";
  std::fprintf(
      stderr, "%s\n",
      fmt::format("memory copy {:.1f} GB/s; gemm curve eff_max {:.2f}, d0 {:.0f}; {} hosts "
                  "of {} ranks: all_reduce inside a host alpha {:.1f} us, bus bandwidth "
                  "{:.2f} GB/s; between hosts alpha {:.1f} us, bus bandwidth {:.3f} GB/s",
                  c.gpu.hbm_bytes_per_s / 1e9, c.gpu.gemm.eff_max, c.gpu.gemm.d0, hosts.hosts(),
                  per_host, intra.alpha * 1e6, intra.bus_bytes_per_s / 1e9, inter.alpha * 1e6,
                  inter.bus_bytes_per_s / 1e9)
          .c_str());
  std::string curve;
  for (size_t i = 0; i < c.inter_curve.bytes.size(); ++i)
    curve += fmt::format("{}{:.0f} KiB {:.2f} ms", i ? ", " : "", c.inter_curve.bytes[i] / 1024,
                         c.inter_curve.seconds[i] * 1e3);
  std::fprintf(stderr, "%s\n",
               fmt::format("all_reduce between hosts by size (median): {}", curve).c_str());
  if (const auto dir = std::filesystem::path(out_path).parent_path(); !dir.empty())
    std::filesystem::create_directories(dir);
  io::write_file(out_path, plan::to_json(c).dump(2) + "\n");
  std::printf("wrote %s\n", out_path.c_str());
}

// local: the host measured by this process, the all-reduce over 2 rank threads. mpi (under
// mpirun, every process runs this): rank 0 measures the host while the others wait, then
// all time MPI's all_reduce, and rank 0 writes the preset.
void run_calibrate(const std::string& out_path, bool quick, const std::string& backend_flag) {
  // Before minutes of measuring: the preset's folder is made now, and must be writable (on
  // rank 0's node, which writes it).
  if (comm::mpi_env_world_rank() == 0) {
    const std::filesystem::path dir = std::filesystem::path(out_path).parent_path();
    if (!dir.empty()) train::check_output_dir(dir.string(), "--out");
    train::check_output_file(out_path, "--out");
  }
  comm::LaunchOptions lo;
  lo.backend = comm::parse_backend(backend_flag);
  lo.timeout_s = 300;
  const comm::BackendKind kind = comm::resolve_backend(lo);
  if (kind == comm::BackendKind::kNccl)
    fail(
        "calibrate --backend nccl: not available; calibrate measures CPU ranks (local or mpi). "
        "For GPUs use a preset (--cluster dgx-a100, dgx-h100, hgx-b200) or a JSON cluster file");
  if (kind == comm::BackendKind::kLocal) {
    const int cores = kernels::host_cores();
    const plan::ClusterSpec c = measure_host(quick, cores, cores, [](double v) { return v; });
    // Rank threads from 2 to 4x the cores (at least 8): past the cores every ring step
    // waits for the scheduler, and α and the bandwidth change by an order of magnitude.
    std::vector<plan::HostLink> links;
    for (int ranks = 2; ranks <= std::max(8, 4 * cores); ranks *= 2) {
      lo.world_size = ranks;
      plan::HostLink h;
      h.ranks = ranks;
      comm::launch(lo, [&](comm::Group& world) {
        const AlphaBeta r = allreduce_alpha_beta(world);
        if (world.rank() == 0) h.latency_s = r.alpha, h.bytes_per_s = r.bus_bytes_per_s;
      });
      links.push_back(h);
      if (quick) break;
    }
    report_and_write(c, links, kind, out_path);
    return;
  }
  lo.world_size = 0;
  comm::launch(lo, [&](comm::Group& world) {
    if (world.size() < 2)
      fail(
          "calibrate --backend mpi needs at least 2 processes to time MPI's all_reduce: run "
          "it as `mpirun -np 2 meshtrain calibrate --backend mpi`");
    // mpirun binds each process to its own core(s) when np <= cores: the job's cores are the
    // ranks' together (at most the host's). The first min(np, cores) processes measure the
    // host at the same time, one thread per core in all, and add up their rates; the others
    // wait asleep (Open MPI's barrier spins, which would take a core from the ones measuring;
    // and more measuring threads than cores would each time a GEMM inside one time slice and
    // report a whole core).
    const int mine = kernels::host_cores();
    float cores = static_cast<float>(mine);
    world.all_reduce(comm::Buf(&cores, 1));
    const int job_cores =
        std::min(static_cast<int>(cores),
                 std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
    const int measuring = std::min(world.size(), job_cores);
    auto wait_for_rank0 = [&] {
      float token = 0;
      comm::WorkPtr w = world.recv_async(comm::Buf(&token, 1), 0);
      while (!w->test()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      w->wait();
    };
    auto wake_from = [&](int first) {
      float token = 0;
      for (int r = first; r < world.size(); ++r) world.send(comm::Buf(&token, 1), r);
    };
    plan::ClusterSpec c;
    {
      std::unique_ptr<comm::Group> team =
          world.split(world.rank() < measuring ? 0 : -1, world.rank(), "calibrate-host");
      if (team) {
        // The job's cores dealt over the measuring processes (the first ones one more when
        // they do not divide), never more threads than a process's own cores.
        const int r = world.rank();
        const int threads = std::max(
            1, std::min(mine, job_cores / measuring + (r < job_cores % measuring ? 1 : 0)));
        c = measure_host(quick, job_cores, threads, [&](double v) {
          float x = static_cast<float>(v);
          team->all_reduce(comm::Buf(&x, 1));
          return static_cast<double>(x);
        });
        if (world.rank() == 0) wake_from(measuring);
      } else {
        wait_for_rank0();
      }
    }
    const comm::HostMap hosts = comm::exchange_host_names(world);
    if (hosts.hosts() > 1) {
      // The link inside a host, then between hosts, each timed the way training loads it:
      // every host's ranks all-reduce at once (tp inside the hosts), then every rank at once
      // with its counterparts on the other hosts (dp across them: a group per position in
      // the host). On hosts that share a link or cores (network namespaces on one machine,
      // one NIC per host) the concurrent groups split them, as the training's do; one group
      // alone would see the whole link. Rank 0's group reports.
      std::vector<int> local(static_cast<size_t>(world.size()), 0);
      std::vector<int> on_host(static_cast<size_t>(hosts.hosts()), 0);
      for (int r = 0; r < world.size(); ++r)
        local[static_cast<size_t>(r)] =
            on_host[static_cast<size_t>(hosts.host_of_rank[static_cast<size_t>(r)])]++;
      const int per_host = on_host[0];
      if (per_host < 2)
        fail(
            "calibrate across {} hosts needs at least 2 ranks on rank 0's host ({}) to time the "
            "link inside a host: give each host 2 slots or more (hostfile slots=2) and -np to "
            "match",
            hosts.hosts(), hosts.names[0]);
      // The ranks of one color(r) in a group; nullptr where a rank's group would be itself.
      auto split_by = [&](const std::function<int(int)>& color, const std::string& name) {
        std::vector<int> size;
        for (int r = 0; r < world.size(); ++r) {
          const int k = color(r);
          if (k >= static_cast<int>(size.size())) size.resize(static_cast<size_t>(k) + 1, 0);
          ++size[static_cast<size_t>(k)];
        }
        const int mine = color(world.rank());
        return world.split(size[static_cast<size_t>(mine)] > 1 ? mine : -1, world.rank(), name);
      };
      auto timed = [&](comm::Group* g) {
        AlphaBeta ab;
        if (g) ab = allreduce_alpha_beta(*g);
        world.barrier();
        return ab;
      };
      const std::unique_ptr<comm::Group> intra_g = split_by(
          [&](int r) { return hosts.host_of_rank[static_cast<size_t>(r)]; }, "calibrate-intra");
      const std::unique_ptr<comm::Group> inter_g =
          split_by([&](int r) { return local[static_cast<size_t>(r)]; }, "calibrate-inter");
      const AlphaBeta intra = timed(intra_g.get());
      const AlphaBeta inter = timed(inter_g.get());
      // And by size: mid-size messages over TCP take longer than α and the bandwidth say.
      const plan::LinkCurve curve = allreduce_curve(world, inter_g.get(), quick);
      if (world.rank() == 0) write_hosts(c, hosts, per_host, intra, inter, curve, out_path);
      return;
    }
    // MPI's all-reduce over the first k processes, k = 2, 4, ... up to -np: the others wait
    // asleep (Open MPI's barrier spins, which would take a core from the ones measuring).
    std::vector<plan::HostLink> links;
    for (int k = 2;; k = std::min(2 * k, world.size())) {
      std::unique_ptr<comm::Group> sub =
          world.split(world.rank() < k ? 0 : -1, world.rank(), fmt::format("calibrate{}", k));
      if (sub) {
        const AlphaBeta ab = allreduce_alpha_beta(*sub);
        if (world.rank() == 0) {
          links.push_back({k, ab.alpha, ab.bus_bytes_per_s});
          wake_from(k);
        }
      } else {
        wait_for_rank0();
      }
      if (k == world.size()) break;
    }
    if (world.rank() == 0) report_and_write(c, links, kind, out_path);
  });
}

}  // namespace

void register_calibrate(CLI::App& app) {
  auto out = std::make_shared<std::string>(plan::this_host_path());
  auto quick = std::make_shared<bool>(false);
  auto backend = std::make_shared<std::string>("auto");
  auto dev = std::make_shared<std::string>("cpu");
  auto links_from = std::make_shared<std::string>();
  auto sustain_s = std::make_shared<double>(30.0);
  CLI::App* cmd = app.add_subcommand(
      "calibrate",
      "measure this host (GEMM by shape, memory, collectives) as --cluster this-host, or one "
      "GPU (--device cuda) as a cluster file");
  cmd->add_option("--out", *out,
                  "where to write the preset (default: the this-host cache; with --device cuda "
                  "this-gpu.json)");
  cmd->add_option("--device", *dev,
                  "cpu (this host's cores and collectives) or cuda (GPU 0: GEMM by shape, "
                  "memory, fused attention, launch floor)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--links-from", *links_from,
                  "with --device cuda: the preset whose NVLink and network figures the file "
                  "takes (default: by the GPU's generation, e.g. dgx-h100)");
  cmd->add_option("--sustain-seconds", *sustain_s,
                  "with --device cuda: seconds of back-to-back GEMMs to measure the rate kept "
                  "at the power limit (compute_sustain; 0: skip)")
      ->check(CLI::Range(0.0, 3600.0));
  cmd->add_flag("--quick", *quick, "smaller shapes, fewer repetitions (tests)");
  cmd->add_option("--backend", *backend,
                  "whose collectives to time: local (rank threads), mpi (under mpirun), auto "
                  "(mpi under mpirun, else local)");
  cmd->callback([cmd, out, quick, backend, dev, links_from, sustain_s] {
    if (*dev == "cuda") {
      const bool out_given = cmd->count("--out") > 0;
      run_calibrate_gpu(out_given ? *out : std::string("this-gpu.json"), *quick, *links_from,
                        *sustain_s);
      return;
    }
    if (!links_from->empty())
      fail(
          "calibrate --links-from {}: only with --device cuda (a CPU host measures its own "
          "links)",
          *links_from);
    run_calibrate(*out, *quick, *backend);
  });
}

}  // namespace mt::cli

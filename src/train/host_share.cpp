#include "train/host_share.h"

#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <bit>
#include <string>

#include "comm/group.h"
#include "kernels/kernels.h"
#include "kernels/peak.h"
#include "obs/run_info.h"

namespace mt::train {
namespace {

constexpr size_t kMaskWords = CPU_SETSIZE / 64;

bool holds(const RankPlace& r, size_t cpu) {
  return cpu / 64 < r.cpus.size() && ((r.cpus[cpu / 64] >> (cpu % 64)) & 1u);
}

int64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return static_cast<int64_t>(h);
}

}  // namespace

double cpu_cores_owned(const std::vector<RankPlace>& ranks, int me) {
  const RankPlace& mine = ranks.at(static_cast<size_t>(me));
  double owned = 0;
  for (size_t cpu = 0; cpu < 64 * mine.cpus.size(); ++cpu) {
    if (!holds(mine, cpu)) continue;
    int sharing = 0;
    for (const RankPlace& r : ranks) sharing += r.host == mine.host && holds(r, cpu);
    owned += 1.0 / sharing;  // >= 1: `mine` holds it
  }
  return owned;
}

double gpu_share(const std::vector<RankPlace>& ranks, int me) {
  const RankPlace& mine = ranks.at(static_cast<size_t>(me));
  int sharing = 0;
  for (const RankPlace& r : ranks) sharing += r.host == mine.host && r.gpu == mine.gpu;
  return 1.0 / std::max(1, sharing);
}

int gpu_measurer(const std::vector<RankPlace>& ranks, int me) {
  const RankPlace& mine = ranks.at(static_cast<size_t>(me));
  for (int r = 0; r < me; ++r)
    if (ranks[size_t(r)].host == mine.host && ranks[size_t(r)].gpu == mine.gpu) return r;
  return me;
}

CpuPeakBasis cpu_peak_basis(int threads, int cpus_in_mask, double cores_owned) {
  CpuPeakBasis b;
  b.peak_threads = std::max(1, std::min(threads, cpus_in_mask));
  // Unknown (no mask read): the threads' whole peak, as before masks were read.
  if (cores_owned > 0) b.share = std::min(1.0, cores_owned / b.peak_threads);
  return b;
}

RankPlace my_place(int gpu) {
  RankPlace p;
  p.host = fnv1a(obs::host_name());
  p.gpu = gpu;
  p.cpus.assign(kMaskWords, 0);
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (size_t c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) p.cpus[c / 64] |= uint64_t{1} << (c % 64);
  }
  return p;
}

RankPeak rank_peak_flops(comm::Group* world, DType gemm_dtype, int threads, int gpu) {
  return rank_peak_flops(world, gemm_dtype, threads, gpu,
                         [gemm_dtype] { return kernels::gpu_peak_flops(gemm_dtype); });
}

RankPeak rank_peak_flops(comm::Group* world, DType gemm_dtype, int threads, int gpu,
                         const std::function<double()>& measure_gpu) {
  const RankPlace me = my_place(gpu);
  const int n = world ? world->size() : 1, rank = world ? world->rank() : 0;
  // Rows of [host, gpu, mask words]; int64 as the bits of two f32 (an all-gather only copies).
  const size_t row = 2 + kMaskWords;
  std::vector<int64_t> mine(row), all(row * static_cast<size_t>(n));
  mine[0] = me.host;
  mine[1] = me.gpu;
  std::copy(me.cpus.begin(), me.cpus.end(), mine.begin() + 2);
  if (world) {
    const int64_t elems = 2 * static_cast<int64_t>(row);
    world->all_gather(comm::Buf(reinterpret_cast<float*>(mine.data()), elems),
                      comm::Buf(reinterpret_cast<float*>(all.data()), elems * n));
  } else {
    all = mine;
  }
  std::vector<RankPlace> places(static_cast<size_t>(n));
  bool host_leader = true;  // the first rank of its host
  for (int r = 0; r < n; ++r) {
    const int64_t* at = all.data() + row * static_cast<size_t>(r);
    places[r].host = at[0];
    places[r].gpu = at[1];
    places[r].cpus.assign(at + 2, at + row);
    if (r < rank && at[0] == me.host) host_leader = false;
  }
  if (gpu >= 0) {
    // One rank per (host, GPU) times the device while the others sharing it wait here; every
    // rank then takes its measurer's figure (a double as the bits of two floats).
    const int measurer = gpu_measurer(places, rank);
    std::vector<double> peaks(static_cast<size_t>(n), 0.0);
    double measured = measurer == rank ? measure_gpu() : 0.0;
    if (world) {
      world->all_gather(comm::Buf(reinterpret_cast<float*>(&measured), 2),
                        comm::Buf(reinterpret_cast<float*>(peaks.data()), 2 * int64_t{n}));
    } else {
      peaks[0] = measured;
    }
    const double share = gpu_share(places, rank);
    return {peaks[static_cast<size_t>(measurer)] * share, share, true};
  }
  int in_mask = 0;
  for (uint64_t w : me.cpus) in_mask += std::popcount(w);
  const CpuPeakBasis b = cpu_peak_basis(threads, in_mask, cpu_cores_owned(places, rank));
  double peak = 0;
  if (host_leader) peak = kernels::peak_flops(gemm_dtype, b.peak_threads);
  if (world) world->barrier();  // the others read what the host's first rank measured
  if (!host_leader) peak = kernels::peak_flops(gemm_dtype, b.peak_threads);
  return {peak * b.share, b.peak_threads * b.share, false};
}

std::string mfu_above_peak_warning(double mfu, const RankPeak& peak, bool given) {
  const std::string what = fmt::format("{:.1f} GFLOP/s", peak.flops / 1e9);
  if (given)
    return fmt::format(
        "warning: MFU {:.1f}% is impossible: --peak-gflops gives a peak ({}) below what this run "
        "computes; give the device's real GEMM peak (meshtrain calibrate measures it)",
        100 * mfu, what);
  if (peak.gpu)
    return fmt::format(
        "warning: MFU {:.1f}% is impossible: the GPU peak it divides by ({} for this rank) was "
        "measured low, probably while other work used the GPU; give --peak-gflops, or run on an "
        "idle GPU",
        100 * mfu, what);
  return fmt::format(
      "warning: MFU {:.1f}% is impossible: the CPU GEMM peak it divides by ({} for this rank) "
      "was measured while other work ran beside it, and a cached peak is never lowered; delete "
      "{} on a quiet machine (the next run measures again) or give --peak-gflops",
      100 * mfu, what, kernels::peak_cache_path());
}

void ImpossibleMfuWarning::check(double mfu, const RankPeak& peak, bool given) {
  if (said_ || !(mfu > kMfuImpossible)) return;
  said_ = true;
  fmt::print(stderr, "{}\n", mfu_above_peak_warning(mfu, peak, given));
}

}  // namespace mt::train

// How much of this host's compute one rank has, for MFU's peak. The ranks on a host share its
// cores: with more rank threads than cores (4 ranks of 1 thread on 2 cores) each rank computes
// on a fraction of a core, and a rank that mpirun bound to one core of two has that core alone
// (not half of it: dividing the core it sees by the ranks on the host showed MFU 159%). So each
// rank's cores come from the affinity masks of all the ranks on its host: a core in k ranks'
// masks counts 1/k for each. GPUs likewise: a device shared by k ranks counts 1/k for each.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace mt::comm {
class Group;
}

namespace mt::train {

// One rank's view of where it computes: a host id, its GPU (-1: none) and its CPU affinity
// mask (bit c of word c/64: CPU c may run its threads).
struct RankPlace {
  int64_t host = 0;
  int64_t gpu = -1;
  std::vector<uint64_t> cpus;
};

// The cores' worth rank `me` has: for each CPU in its mask, 1 / the number of ranks on its
// host whose masks hold that CPU. 4 ranks on one 2-core mask: 0.5 each; 2 ranks bound to a
// core each: 1 each.
double cpu_cores_owned(const std::vector<RankPlace>& ranks, int me);

// The fraction of its device rank `me` has: 1 / the ranks on its host using the same GPU.
double gpu_share(const std::vector<RankPlace>& ranks, int me);

// The rank that measures the peak of rank `me`'s GPU: the first on its host with that GPU.
// Timed by every process at once, a GPU shared by k ranks would show each about 1/k of its
// peak, and MFU (over that times 1/k) would read k times too high; the others take its figure.
int gpu_measurer(const std::vector<RankPlace>& ranks, int me);

// The CPU peak MFU divides by: the GEMM peak at the threads the rank can run at once
// (`peak_threads`, its threads but no more than the CPUs in its mask) times `share`, the
// fraction of those threads' cores it really has (1 when it owns that many cores).
struct CpuPeakBasis {
  int peak_threads = 1;
  double share = 1;
};
CpuPeakBasis cpu_peak_basis(int threads, int cpus_in_mask, double cores_owned);

// This rank's place: the host name's hash, `gpu`, and the calling thread's affinity mask.
RankPlace my_place(int gpu);

// The peak (FLOP/s) MFU divides by for this rank of `world` (collective: every rank calls
// it once): on a GPU the device's peak over the ranks sharing it; on a CPU the GEMM peak at
// the basis above. A peak not yet cached is measured by one rank of a host at a time, so
// ranks that share cores do not measure each other's load; a GPU's by one of the ranks that
// share it (gpu_measurer), the others waiting.
struct RankPeak {
  double flops = 0;
  double units = 0;  // the cores' worth (CPU) or the fraction of the device (GPU) it is of
  bool gpu = false;
};
RankPeak rank_peak_flops(comm::Group* world, DType gemm_dtype, int threads, int gpu);
// The same with the GPU's measurement given (the one above times an 8192³ GEMM on the
// device, kernels::gpu_peak_flops); called on the measuring ranks only (gpu_measurer).
RankPeak rank_peak_flops(comm::Group* world, DType gemm_dtype, int threads, int gpu,
                         const std::function<double()>& measure_gpu);

// MFU above kMfuImpossible cannot be: the peak it divides by is below what the run computed,
// as when the cached CPU peak was measured while other work ran beside it (a stored peak is
// never lowered, so a low one stays until deleted). The line that says so, naming the peak,
// where it came from and the fix; `given`: --peak-gflops set it.
constexpr double kMfuImpossible = 1.05;  // 5%: the peak's own timing noise
std::string mfu_above_peak_warning(double mfu, const RankPeak& peak, bool given);
// Prints that line (stderr) the first time a run's MFU passes kMfuImpossible, once a run.
class ImpossibleMfuWarning {
 public:
  void check(double mfu, const RankPeak& peak, bool given);

 private:
  bool said_ = false;
};

}  // namespace mt::train

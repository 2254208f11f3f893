// MFU's peak for one rank: the cores (or the device) it really has, from the affinity masks
// of all the ranks on its host.
#include "train/host_share.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>

#include "comm/comm_test_util.h"

namespace mt::train {
namespace {

RankPlace on(int64_t host, std::vector<int> cpus, int64_t gpu = -1) {
  RankPlace p;
  p.host = host;
  p.gpu = gpu;
  p.cpus.assign(16, 0);
  for (int c : cpus) p.cpus[c / 64] |= uint64_t{1} << (c % 64);
  return p;
}

// mpirun -np 2 on 2 cores binds each rank to one: each has that core alone. Dividing the one
// core it sees by the 2 ranks on the host made MFU 159%.
TEST(HostShare, BoundRanksOwnTheirCores) {
  const std::vector<RankPlace> r{on(7, {0}), on(7, {1})};
  EXPECT_EQ(cpu_cores_owned(r, 0), 1.0);
  EXPECT_EQ(cpu_cores_owned(r, 1), 1.0);
  const CpuPeakBasis b = cpu_peak_basis(1, 1, 1.0);
  EXPECT_EQ(b.peak_threads, 1);
  EXPECT_EQ(b.share, 1.0);
  // --threads 2 on a rank bound to one core: one core's peak, not a 2-thread one.
  const CpuPeakBasis t2 = cpu_peak_basis(2, 1, 1.0);
  EXPECT_EQ(t2.peak_threads, 1);
  EXPECT_EQ(t2.share, 1.0);
}

// 4 ranks of 1 thread on 2 unbound cores compute on half a core each (dividing by a whole
// core per rank capped the reported MFU at 50%).
TEST(HostShare, OversubscribedRanksShareTheCores) {
  const std::vector<RankPlace> r(4, on(7, {0, 1}));
  EXPECT_EQ(cpu_cores_owned(r, 2), 0.5);
  const CpuPeakBasis b = cpu_peak_basis(1, 2, 0.5);
  EXPECT_EQ(b.peak_threads, 1);
  EXPECT_EQ(b.share, 0.5);
  const CpuPeakBasis t2 = cpu_peak_basis(2, 2, 0.5);  // --threads 2: a quarter of 2 threads
  EXPECT_EQ(t2.peak_threads, 2);
  EXPECT_EQ(t2.share, 0.25);
}

TEST(HostShare, RanksThatFitHaveTheirWholeThreads) {
  const std::vector<RankPlace> one{on(7, {0, 1})};
  EXPECT_EQ(cpu_cores_owned(one, 0), 2.0);
  EXPECT_EQ(cpu_peak_basis(2, 2, 2.0).share, 1.0);
  // Fewer threads than cores: the threads' peak, whole.
  EXPECT_EQ(cpu_peak_basis(4, 16, 8.0).peak_threads, 4);
  EXPECT_EQ(cpu_peak_basis(4, 16, 8.0).share, 1.0);
  EXPECT_EQ(cpu_peak_basis(1, 0, 0.0).share, 1.0);  // no mask read: as before
}

// Ranks of other hosts do not share this host's CPUs or GPUs, whatever their numbers.
TEST(HostShare, OnlyTheSameHostShares) {
  const std::vector<RankPlace> r{on(1, {0}, 0), on(2, {0}, 0), on(1, {0, 1}, 0), on(1, {1}, 1)};
  EXPECT_EQ(cpu_cores_owned(r, 0), 0.5);        // cpu 0 with rank 2
  EXPECT_EQ(cpu_cores_owned(r, 1), 1.0);        // alone on host 2
  EXPECT_EQ(cpu_cores_owned(r, 2), 0.5 + 0.5);  // cpu 0 with rank 0, cpu 1 with rank 3
  EXPECT_EQ(gpu_share(r, 0), 0.5);              // GPU 0 of host 1 with rank 2
  EXPECT_EQ(gpu_share(r, 1), 1.0);
  EXPECT_EQ(gpu_share(r, 3), 1.0);
}

// Ranks sharing a GPU: the first of them times it, alone, and all of them divide that one
// figure (timed by every process at once, each would see about half the peak: MFU twice too
// high). 4 rank threads on one host, GPUs 0, 0, 1, 1; the fake measurement returns a new
// value at every call, so a rank that measured for itself would differ from its partner.
TEST(HostShare, OneRankPerGpuMeasuresAndTheOthersTakeItsFigure) {
  const std::vector<RankPlace> r{on(7, {0}, 0), on(7, {1}, 0), on(7, {0}, 1), on(7, {1}, 1)};
  EXPECT_EQ(gpu_measurer(r, 0), 0);
  EXPECT_EQ(gpu_measurer(r, 1), 0);
  EXPECT_EQ(gpu_measurer(r, 2), 2);
  EXPECT_EQ(gpu_measurer(r, 3), 2);
  std::atomic<int> calls{0};
  std::mutex mu;
  std::vector<RankPeak> got(4);
  comm::testing::run_local(4, [&](comm::Group& g) {
    const RankPeak p = rank_peak_flops(&g, DType::kBF16, 1, g.rank() / 2,
                                       [&] { return 1000.0 * (1 + calls.fetch_add(1)); });
    std::lock_guard<std::mutex> lock(mu);
    got[size_t(g.rank())] = p;
  });
  EXPECT_EQ(calls.load(), 2);  // once per GPU
  for (int k = 0; k < 4; ++k) {
    EXPECT_TRUE(got[size_t(k)].gpu);
    EXPECT_EQ(got[size_t(k)].units, 0.5);
  }
  EXPECT_EQ(got[0].flops, got[1].flops);
  EXPECT_EQ(got[2].flops, got[3].flops);
  EXPECT_NE(got[0].flops, got[2].flops);  // each GPU its own measurement
  EXPECT_TRUE(got[0].flops == 500.0 || got[0].flops == 1000.0) << got[0].flops;
}

}  // namespace
}  // namespace mt::train

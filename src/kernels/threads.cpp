// Intra-op threads: OpenMP's nthreads-var is per thread, so each rank thread that calls
// set_threads gets its own team size for the kernels (and oneDNN) it runs.
#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <thread>

#include "core/error.h"
#include "kernels/kernels.h"

namespace mt::kernels {

// oneDNN (2.6, OpenMP runtime) splits a GEMM for omp_get_max_threads() threads and leaves
// part of the output unwritten when OMP_THREAD_LIMIT grants fewer (half of it at
// OMP_THREAD_LIMIT=1 on 2 cores): every request stays within the limit.
void set_threads(int n) {
  if (n < 1) fail("kernel threads must be >= 1, got {}", n);
  omp_set_num_threads(std::min(n, omp_get_thread_limit()));
}

// On every call: the team size is an ICV of the current task, so a parallel region's
// implicit tasks start again from the value they inherit.
void respect_thread_limit() {
  const int limit = omp_get_thread_limit();
  if (omp_get_max_threads() > limit) omp_set_num_threads(limit);
}

int threads() { return omp_get_max_threads(); }

int host_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int>(n) : 1;
}

}  // namespace mt::kernels

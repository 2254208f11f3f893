// Intra-op threads: OpenMP's nthreads-var is per thread, so each rank thread that calls
// set_threads gets its own team size for the kernels (and oneDNN) it runs.
#include <omp.h>
#include <sched.h>

#include <thread>

#include "core/error.h"
#include "kernels/kernels.h"

namespace mt::kernels {

void set_threads(int n) {
  if (n < 1) fail("kernel threads must be >= 1, got {}", n);
  omp_set_num_threads(n);
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

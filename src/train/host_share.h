// How much of this host's CPU one rank has: the ranks on a host share its cores, so with more
// rank threads than cores (4 ranks of 1 thread on 2 cores) each rank computes on a fraction of
// a core. MFU divides by the rank's share of the host's peak, not by a whole core per rank:
// otherwise 4 ranks on 2 cores could never show more than 50%.
#pragma once

#include <algorithm>

namespace mt::train {

// The fraction of `threads` cores' worth of compute a rank has when `ranks_on_host` ranks of
// `threads` threads each share `cores` cores: 1 while they fit.
inline double cpu_host_share(int cores, int ranks_on_host, int threads) {
  const double wanted = double(std::max(1, ranks_on_host)) * std::max(1, threads);
  return std::min(1.0, double(std::max(1, cores)) / wanted);
}

}  // namespace mt::train

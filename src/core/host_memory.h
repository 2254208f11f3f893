// How much memory this host can still give a job: /proc/meminfo's MemAvailable, lowered by
// the limit of every cgroup (v1 or v2) the process is in, less what that cgroup already uses
// (its working set: usage minus the inactive page cache, which the kernel reclaims first).
// `train` compares its memory model's estimate with it before allocating anything.
#pragma once

#include <cstdint>
#include <string>

namespace mt::host_memory {

struct Available {
  int64_t bytes = -1;  // -1: unknown (no /proc)
  std::string source;  // "MemAvailable", "cgroup /docker/abc (limit 8.0 GB)", ...
};

// MESHTRAIN_HOST_MEMORY (bytes), when set, replaces what the host says: a budget on a shared
// host, and what the tests use to stand for a small host.
Available available();

}  // namespace mt::host_memory

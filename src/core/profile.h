// A per-thread profile of where a step's time goes: named regions accumulate wall time
// and call counts while profiling is on for the calling thread (`meshtrain train
// --profile`). Off, a region costs one branch. On a GPU a region waits for the thread's
// stream at its start and end, so it measures its kernels (and the host no longer runs
// ahead of the GPU: a profiled step is slower).
#pragma once

#include <map>
#include <string>

#include "core/clock.h"
#include "core/device.h"

namespace mt::profile {

struct Entry {
  double time_s = 0;
  int64_t calls = 0;
};

void enable(bool on);  // for the calling thread
bool enabled();
std::map<std::string, Entry>& entries();  // the calling thread's
void reset();

class Scope {
 public:
  explicit Scope(const char* name) : name_(enabled() ? name : nullptr) {
    if (!name_) return;
    device::synchronize();
    start_ = now_s();
  }
  ~Scope() {
    if (!name_) return;
    try {
      device::synchronize();
    } catch (...) {  // a GPU error: the next kernel call reports it
    }
    Entry& e = entries()[name_];
    e.time_s += now_s() - start_;
    e.calls += 1;
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  const char* name_;
  double start_ = 0;
};

}  // namespace mt::profile

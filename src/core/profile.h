// A per-thread profile of where a step's time goes: named regions accumulate wall time
// and call counts while profiling is on for the calling thread (`meshtrain train
// --profile`). Off, a region costs one branch. On a GPU a region waits for the thread's
// stream at its start and end, so it measures its kernels (and the host no longer runs
// ahead of the GPU: a profiled step is slower). Regions nest: a region's time is its own,
// less the regions opened inside it (the bf16 conversions inside a linear, the linears
// inside a recomputed forward), so the entries add up to the time profiled.
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

class Scope;
Scope*& innermost();  // the calling thread's open region, or null

class Scope {
 public:
  explicit Scope(const char* name) : name_(enabled() ? name : nullptr) {
    if (!name_) return;
    device::synchronize();
    start_ = now_s();
    parent_ = innermost();
    innermost() = this;
  }
  ~Scope() {
    if (!name_) return;
    try {
      device::synchronize();
    } catch (...) {  // a GPU error: the next kernel call reports it
    }
    const double elapsed = now_s() - start_;
    innermost() = parent_;
    if (parent_) parent_->inner_s_ += elapsed;
    Entry& e = entries()[name_];
    e.time_s += elapsed - inner_s_;
    e.calls += 1;
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  const char* name_;
  double start_ = 0;
  double inner_s_ = 0;  // the regions opened inside this one
  Scope* parent_ = nullptr;
};

}  // namespace mt::profile

#pragma once

#include <chrono>

namespace mt {

// Seconds on a monotonic clock; only differences mean anything.
inline double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace mt

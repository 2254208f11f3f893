#include "core/memory.h"

#include "core/device.h"

#include <cstdlib>
#include <new>

#include "core/error.h"

namespace mt::mem {

std::string_view category_name(Category c) {
  static constexpr std::string_view kNames[kNumCategories] = {
      "parameters", "gradients", "optimizer", "activations", "communication", "workspace"};
  return kNames[static_cast<int>(c)];
}

namespace {
void raise_peak(std::atomic<int64_t>& peak, int64_t value) {
  int64_t seen = peak.load(std::memory_order_relaxed);
  while (value > seen && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

Tracker& process_tracker() {
  static Tracker t;
  return t;
}
thread_local Tracker* t_current = nullptr;
}  // namespace

void Tracker::on_alloc(Category c, int64_t bytes) {
  int i = static_cast<int>(c);
  raise_peak(peak_[i], current_[i].fetch_add(bytes, std::memory_order_relaxed) + bytes);
  raise_peak(total_peak_, total_current_.fetch_add(bytes, std::memory_order_relaxed) + bytes);
  allocations_.fetch_add(1, std::memory_order_relaxed);
}

void Tracker::on_free(Category c, int64_t bytes) {
  current_[static_cast<int>(c)].fetch_sub(bytes, std::memory_order_relaxed);
  total_current_.fetch_sub(bytes, std::memory_order_relaxed);
}

Snapshot Tracker::snapshot() const {
  Snapshot s;
  for (int i = 0; i < kNumCategories; ++i) {
    s.current_bytes[i] = current_[i].load(std::memory_order_relaxed);
    s.peak_bytes[i] = peak_[i].load(std::memory_order_relaxed);
  }
  s.total_current_bytes = total_current_.load(std::memory_order_relaxed);
  s.total_peak_bytes = total_peak_.load(std::memory_order_relaxed);
  s.allocations = allocations_.load(std::memory_order_relaxed);
  return s;
}

void Tracker::reset_peaks() {
  for (int i = 0; i < kNumCategories; ++i) peak_[i].store(current_[i].load());
  total_peak_.store(total_current_.load());
}

Tracker& current_tracker() { return t_current ? *t_current : process_tracker(); }

ScopedTracker::ScopedTracker(Tracker& t) : previous_(t_current) { t_current = &t; }
ScopedTracker::~ScopedTracker() { t_current = previous_; }

Block allocate(int64_t bytes, Category c, Device d) {
  Block b;
  b.bytes = bytes;
  b.category = c;
  b.device = d;
  b.tracker = &current_tracker();
  if (bytes > 0 && d == Device::kCuda) {
    b.ptr = device::cuda_malloc(bytes);  // 256-byte aligned
  } else if (bytes > 0) {
    int64_t rounded = (bytes + 63) / 64 * 64;
    b.ptr = std::aligned_alloc(64, static_cast<size_t>(rounded));
    if (!b.ptr)
      fail_run("out of host memory allocating {} bytes of {}", bytes, category_name(c));
  }
  b.tracker->on_alloc(c, bytes);
  return b;
}

void release(Block& b) {
  if (!b.tracker) return;
  if (b.device == Device::kCuda)
    device::cuda_free(b.ptr);
  else
    std::free(b.ptr);
  b.tracker->on_free(b.category, b.bytes);
  b = Block{};
}

}  // namespace mt::mem

// The accounting allocator: every large buffer of a rank is allocated here, under a
// category, so that current and peak bytes per category are exact and can be checked
// against the planner's formulas (DESIGN.md, idea 5).
//
// Each rank has its own Tracker. Ranks that are threads of one process install theirs
// with ScopedTracker; allocations made on a thread without one go to the process tracker.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string_view>

namespace mt::mem {

enum class Category : uint8_t {
  kParameters,
  kGradients,
  kOptimizer,
  kActivations,
  kCommunication,
  kWorkspace,
};
constexpr int kNumCategories = 6;
std::string_view category_name(Category c);

enum class Device : uint8_t { kCpu, kCuda };

struct Snapshot {
  std::array<int64_t, kNumCategories> current_bytes{};
  std::array<int64_t, kNumCategories> peak_bytes{};  // peak of each category on its own
  int64_t total_current_bytes = 0;
  int64_t total_peak_bytes = 0;  // peak of the sum (not the sum of peaks)
  int64_t allocations = 0;       // number of allocations ever made
  int64_t of(Category c) const { return current_bytes[static_cast<int>(c)]; }
  int64_t peak_of(Category c) const { return peak_bytes[static_cast<int>(c)]; }
};

class Tracker {
 public:
  void on_alloc(Category c, int64_t bytes);
  void on_free(Category c, int64_t bytes);
  Snapshot snapshot() const;
  // Peaks restart from the current values (to measure one phase, e.g. one step).
  void reset_peaks();

 private:
  std::array<std::atomic<int64_t>, kNumCategories> current_{};
  std::array<std::atomic<int64_t>, kNumCategories> peak_{};
  std::atomic<int64_t> total_current_{0};
  std::atomic<int64_t> total_peak_{0};
  std::atomic<int64_t> allocations_{0};
};

// The tracker of the calling thread's rank (or the process tracker).
Tracker& current_tracker();

class ScopedTracker {
 public:
  explicit ScopedTracker(Tracker& t);
  ~ScopedTracker();
  ScopedTracker(const ScopedTracker&) = delete;
  ScopedTracker& operator=(const ScopedTracker&) = delete;

 private:
  Tracker* previous_;
};

// A block of device memory, 64-byte aligned, counted against a tracker until freed.
struct Block {
  void* ptr = nullptr;
  int64_t bytes = 0;
  Category category = Category::kWorkspace;
  Device device = Device::kCpu;
  Tracker* tracker = nullptr;
};

Block allocate(int64_t bytes, Category c, Device d = Device::kCpu);
void release(Block& b);

}  // namespace mt::mem

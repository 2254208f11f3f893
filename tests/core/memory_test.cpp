#include "core/memory.h"

#include <gtest/gtest.h>

#include <thread>

#include "core/tensor.h"

namespace mt {
namespace {

TEST(Memory, TracksCurrentAndPeakPerCategory) {
  mem::Tracker tracker;
  mem::ScopedTracker scope(tracker);
  {
    Tensor a = Tensor::empty({10, 10}, DType::kF32, mem::Category::kParameters);
    Tensor b = Tensor::empty({100}, DType::kBF16, mem::Category::kActivations);
    auto s = tracker.snapshot();
    EXPECT_EQ(s.of(mem::Category::kParameters), 400);
    EXPECT_EQ(s.of(mem::Category::kActivations), 200);
    EXPECT_EQ(s.total_current_bytes, 600);
    Tensor v = a.view(10, {5, 10});  // a view allocates nothing
    EXPECT_EQ(tracker.snapshot().allocations, 2);
  }
  auto s = tracker.snapshot();
  EXPECT_EQ(s.total_current_bytes, 0);
  EXPECT_EQ(s.total_peak_bytes, 600);
  EXPECT_EQ(s.peak_of(mem::Category::kParameters), 400);
  tracker.reset_peaks();
  EXPECT_EQ(tracker.snapshot().total_peak_bytes, 0);
}

TEST(Memory, EachRankThreadHasItsOwnTracker) {
  mem::Tracker t1, t2;
  auto work = [](mem::Tracker& t, int64_t n) {
    mem::ScopedTracker scope(t);
    Tensor x = Tensor::empty({n}, DType::kF32, mem::Category::kGradients);
  };
  std::thread a(work, std::ref(t1), 10), b(work, std::ref(t2), 20);
  a.join();
  b.join();
  EXPECT_EQ(t1.snapshot().peak_of(mem::Category::kGradients), 40);
  EXPECT_EQ(t2.snapshot().peak_of(mem::Category::kGradients), 80);
}

TEST(Tensor, ViewsShareStorage) {
  Tensor a = Tensor::zeros({4, 3}, DType::kF32, mem::Category::kWorkspace);
  a[2].f32()[1] = 5.f;
  EXPECT_EQ(a.f32()[7], 5.f);
  EXPECT_EQ(a.reshape({12}).f32()[7], 5.f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.5f)), 1.5f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.00390625f)), 1.0f);  // tie rounds to even
}

}  // namespace
}  // namespace mt

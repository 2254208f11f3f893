#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/kernels.h"
#include "kernels/test_util.h"

namespace mt::kernels {
namespace {

TEST(Elementwise, AddAccumulateScale) {
  const int64_t n = 1001;
  auto a = test::randn(n, 1), b = test::randn(n, 2);
  std::vector<float> y(n);
  add(y.data(), a.data(), b.data(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], a[i] + b[i]);  // one rounding: exact match
  add(a.data(), a.data(), b.data(), n);                          // y may alias a
  EXPECT_EQ(a, y);
  accumulate(y.data(), b.data(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], a[i] + b[i]);
  scale(y.data(), 0.5f, n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], (a[i] + b[i]) * 0.5f);
}

TEST(Elementwise, SumSquaresMatchesAndIsThreadCountIndependent) {
  const int64_t n = 100003;
  auto x = test::randn(n, 3);
  double want = 0;
  for (float v : x) want += double(v) * v;
  const int saved = threads();
  set_threads(1);
  const double s1 = sum_squares(x.data(), n);
  set_threads(2);
  const double s2 = sum_squares(x.data(), n);
  set_threads(3);
  const double s3 = sum_squares(x.data(), n);
  set_threads(saved);
  // Products of floats are exact in double; the sum of 1e5 terms ~1e5 loses ~1e-16 * 1e5.
  EXPECT_NEAR(s1, want, 1e-9 * want);
  EXPECT_EQ(std::memcmp(&s1, &s2, sizeof(double)), 0) << s1 << " vs " << s2;
  EXPECT_EQ(std::memcmp(&s1, &s3, sizeof(double)), 0) << s1 << " vs " << s3;
  EXPECT_EQ(sum_squares(x.data(), 0), 0.0);
  EXPECT_EQ(sum_squares(x.data(), 1), double(x[0]) * x[0]);
}

TEST(Elementwise, CopyAndSumInOrder) {
  auto x = test::randn(1001, 7);
  std::vector<float> y(x.size(), 0.f);
  copy(y.data(), x.data(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(y, x);
  double expect = 0;  // the order the losses of a microbatch were always summed in
  for (float v : x) expect += v;
  EXPECT_EQ(sum(x.data(), static_cast<int64_t>(x.size())), expect);
  EXPECT_EQ(sum(x.data(), 0), 0.0);
}

// Every element of [0, n) becomes +0 and nothing past it is touched, below the parallel
// threshold and above it, on 1 to 3 threads (3: ranges of unequal, unaligned lengths).
TEST(Elementwise, ZeroWritesExactlyItsRangeOnAnyTeam) {
  const int saved = threads();
  for (const int64_t n : {int64_t{0}, int64_t{1}, int64_t{1000}, (int64_t{1} << 18) - 1,
                          (int64_t{1} << 18) + 17, int64_t{1000003}})
    for (int t = 1; t <= 3; ++t) {
      set_threads(t);
      std::vector<float> y(static_cast<size_t>(n) + 5, -1.5f);
      zero(y.data() + 1, n);  // off a line's start
      EXPECT_EQ(y[0], -1.5f);
      for (int64_t i = 1; i <= n; ++i) {
        ASSERT_EQ(y[i], 0.0f) << "n " << n << " threads " << t << " at " << i;
        ASSERT_FALSE(std::signbit(y[i]));
      }
      for (size_t i = static_cast<size_t>(n) + 1; i < y.size(); ++i) ASSERT_EQ(y[i], -1.5f);
    }
  set_threads(saved);
}

// On the CPU attention keeps its probabilities: B·NH·T·T floats each way.
TEST(Attention, StashAndScratchSizesOnTheCpu) {
  EXPECT_EQ(attention_stash_elems(2, 3, 5), 2 * 3 * 5 * 5);
  EXPECT_EQ(attention_scratch_elems(2, 3, 5), 2 * 3 * 5 * 5);
}

TEST(Threads, SetAndQuery) {
  const int saved = threads();
  set_threads(2);
  EXPECT_EQ(threads(), std::min(2, omp_get_thread_limit()));  // OMP_THREAD_LIMIT caps it
  set_threads(saved);
  EXPECT_GE(host_cores(), 1);
  EXPECT_THROW(set_threads(0), mt::Error);
}

}  // namespace
}  // namespace mt::kernels

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
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

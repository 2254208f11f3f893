// The shuffled sample order (train/sample_order.h): each epoch a permutation of the split's
// samples, a pure function of (seed, epoch, position), different from epoch to epoch and
// seed to seed; file order when off.
#include "train/sample_order.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

namespace mt::train {
namespace {

std::vector<int64_t> epoch_of(uint64_t seed, uint64_t epoch, int64_t n) {
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = permuted_index(seed, epoch, i, n);
  return out;
}

// Sizes around the Feistel domain's powers of four (the cycle walk's edge cases) and odd ones.
TEST(SampleOrder, EachEpochIsAPermutation) {
  for (int64_t n : {1, 2, 3, 4, 5, 15, 16, 17, 63, 64, 65, 255, 256, 257, 1000, 4097}) {
    for (uint64_t epoch : {0, 1, 7}) {
      std::vector<int64_t> p = epoch_of(1337, epoch, n);
      std::sort(p.begin(), p.end());
      std::vector<int64_t> want(static_cast<size_t>(n));
      std::iota(want.begin(), want.end(), 0);
      EXPECT_EQ(p, want) << "n " << n << " epoch " << epoch;
    }
  }
}

TEST(SampleOrder, DependsOnSeedAndEpochOnly) {
  const int64_t n = 1000;
  const std::vector<int64_t> a = epoch_of(1337, 0, n);
  EXPECT_EQ(epoch_of(1337, 0, n), a);  // pure: the same again
  EXPECT_NE(epoch_of(1337, 1, n), a);  // another epoch, another order
  EXPECT_NE(epoch_of(1338, 0, n), a);  // another seed, another order
  // Not the identity, nor a rotation of it: most positions move.
  int64_t fixed = 0;
  for (int64_t i = 0; i < n; ++i) fixed += a[size_t(i)] == i;
  EXPECT_LT(fixed, 20) << "a random permutation fixes 1 point on average";
}

TEST(SampleOrder, GlobalIndexWrapsIntoEpochs) {
  const int64_t n = 37;
  const SampleOrder shuffled{true, 42}, in_order{false, 42};
  for (int64_t g = 0; g < 5 * n; ++g) {
    EXPECT_EQ(shuffled.sample(g, n), permuted_index(42, uint64_t(g / n), g % n, n)) << g;
    EXPECT_EQ(in_order.sample(g, n), g % n) << g;
  }
}

}  // namespace
}  // namespace mt::train

// The bucket plan and the shard arithmetic on hand-made layouts.
#include <gtest/gtest.h>

#include <numeric>

#include "parallel/data.h"
#include "parallel/zero.h"

namespace mt::parallel {
namespace {

FlatLayout make(std::vector<int64_t> sizes, int64_t n) {
  FlatLayout l;
  l.param_offsets.push_back(0);
  for (int64_t s : sizes) l.param_offsets.push_back(l.param_offsets.back() + s);
  l.unit_first_param = {0, static_cast<int>(sizes.size())};
  l.padded_elems = pad_to(l.elems(), n);
  return l;
}

TEST(BucketPlan, ContiguousReverseOrderAlignedAndComplete) {
  const FlatLayout l = make({1000, 7, 300, 300, 13, 2000, 5}, 4);
  EXPECT_EQ(l.padded_elems, 3628);  // 3625 rounded up to a multiple of 4
  const auto b = plan_buckets(l, 600, 4);
  ASSERT_FALSE(b.empty());
  EXPECT_EQ(b.front().hi, l.padded_elems);
  EXPECT_EQ(b.back().lo, 0);
  for (size_t i = 0; i < b.size(); ++i) {
    EXPECT_LT(b[i].lo, b[i].hi);
    EXPECT_EQ(b[i].lo % 4, 0);
    EXPECT_EQ(b[i].first_param, l.param_of(b[i].lo));
    if (i + 1 < b.size()) {
      EXPECT_EQ(b[i + 1].hi, b[i].lo);
      EXPECT_GE(b[i].hi - b[i].lo, 600 - 4) << "bucket " << i;  // all but the last are full
    }
  }
}

TEST(BucketPlan, OneBigBucketWhenTheCapExceedsTheModel) {
  const FlatLayout l = make({10, 20, 30}, 2);
  const auto b = plan_buckets(l, 1 << 20, 2);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].lo, 0);
  EXPECT_EQ(b[0].hi, 60);
}

TEST(ShardCounts, PiecesOfARangeInRankOrder) {
  const Shard s(1, 4, 40);  // shards of 10
  EXPECT_EQ(s.lo(), 10);
  EXPECT_EQ(s.counts(5, 27), (std::vector<int64_t>{5, 10, 7, 0}));
  EXPECT_EQ(s.counts(12, 18), (std::vector<int64_t>{0, 6, 0, 0}));
  EXPECT_EQ(s.my_begin(5), 10);
  EXPECT_EQ(s.my_begin(12), 12);
}

TEST(UnitSlots, EmbeddingsHeadAndTwoAlternatingBlockSlots) {
  EXPECT_EQ(UnitBuffers::slot_of(0, 6), 0);
  EXPECT_EQ(UnitBuffers::slot_of(5, 6), 1);
  EXPECT_EQ(UnitBuffers::slot_of(1, 6), 2);
  EXPECT_EQ(UnitBuffers::slot_of(2, 6), 3);
  EXPECT_EQ(UnitBuffers::slot_of(3, 6), 2);
}

}  // namespace
}  // namespace mt::parallel

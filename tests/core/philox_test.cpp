#include "core/philox.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace mt::rng {
namespace {

TEST(Philox, KnownAnswerFromRandom123) {
  // Known-answer vectors of Random123's kat_vectors for philox4x32_10:
  // counter = 0, key = 0 -> 6627e8d5 e169c58d bc57ac4c 9b00dbd8.
  auto w = philox4x32(0, 0, 0);
  EXPECT_EQ(w[0], 0x6627e8d5u);
  EXPECT_EQ(w[1], 0xe169c58du);
  EXPECT_EQ(w[2], 0xbc57ac4cu);
  EXPECT_EQ(w[3], 0x9b00dbd8u);
  // counter = all ones, key = all ones -> 408f276d 41c83b0e a20bc7c6 6d5451fd.
  auto x = philox4x32(~0ull, ~0ull, ~0ull);
  EXPECT_EQ(x[0], 0x408f276du);
  EXPECT_EQ(x[1], 0x41c83b0eu);
  EXPECT_EQ(x[2], 0xa20bc7c6u);
  EXPECT_EQ(x[3], 0x6d5451fdu);
}

TEST(Philox, FillNormalEqualsElementwiseAtAnyOffset) {
  // A shard that starts at an odd global index must draw exactly its own slice.
  std::vector<float> whole(101), part(50);
  fill_normal(whole.data(), 101, 7, stream_of("w"), 0, 0.f, 0.02f);
  fill_normal(part.data(), 50, 7, stream_of("w"), 33, 0.f, 0.02f);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(part[i], whole[33 + i]);
  for (int i = 0; i < 101; ++i) EXPECT_EQ(whole[i], 0.02f * normal(7, stream_of("w"), i));
}

TEST(Philox, NormalMomentsAndStreamsDiffer) {
  const int n = 200000;
  double s = 0, s2 = 0;
  for (int i = 0; i < n; ++i) {
    double z = normal(1, 2, i);
    s += z;
    s2 += z * z;
  }
  // Standard error of the mean is 1/sqrt(n) = 0.0022; 5 sigma bounds.
  EXPECT_NEAR(s / n, 0.0, 0.012);
  EXPECT_NEAR(s2 / n, 1.0, 0.02);
  EXPECT_NE(normal(1, 2, 5), normal(1, 3, 5));
  EXPECT_NE(normal(1, 2, 5), normal(2, 2, 5));
  float u = uniform(1, 2, 3);
  EXPECT_GE(u, 0.f);
  EXPECT_LT(u, 1.f);
}

}  // namespace
}  // namespace mt::rng

#include <gtest/gtest.h>

#include <cmath>

#include "kernels/kernels.h"
#include "kernels/mixed.h"
#include "kernels/test_util.h"

namespace mt::kernels {
namespace {

TEST(AdamW, MatchesScalarReferenceOverSteps) {
  const int64_t n = 257;
  auto p = test::randn(n, 1);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  std::vector<double> rp(p.begin(), p.end()), rm(n, 0.0), rv(n, 0.0);
  const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
  for (int64_t t = 1; t <= 5; ++t) {
    auto g = test::randn(n, 10 + static_cast<uint32_t>(t));
    adamw_update(p.data(), g.data(), m.data(), v.data(), n, float(lr), float(b1), float(b2),
                 float(eps), float(wd), t);
    for (int64_t i = 0; i < n; ++i) {
      rm[i] = b1 * rm[i] + (1 - b1) * g[i];
      rv[i] = b2 * rv[i] + (1 - b2) * g[i] * g[i];
      const double mhat = rm[i] / (1 - std::pow(b1, t)), vhat = rv[i] / (1 - std::pow(b2, t));
      // Decoupled decay: lr * wd * p, not folded into the gradient.
      rp[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * rp[i]);
    }
  }
  // Each step moves a parameter by <= lr * (1 + wd|p|) with ~1e-7 relative error in float;
  // over 5 steps on O(1) parameters the difference stays ~1e-6.
  test::expect_close(p, rp, 1e-5, 1e-6, "param");
  test::expect_close(m, rm, 1e-6, 1e-5, "m");
  test::expect_close(v, rv, 1e-6, 1e-5, "v");
}

// The optimizer's one call over every parameter: each segment exactly as adamw_update on
// it alone (its own weight decay), and elements outside every segment untouched.
TEST(AdamW, MultiSegmentEqualsOneCallPerSegment) {
  const int64_t n = 301;
  const std::vector<AdamwSegment> segs = {{0, 100, 0.1f}, {100, 7, 0.0f}, {120, 181, 0.1f}};
  auto p1 = test::randn(n, 3), p2 = p1;
  std::vector<float> m1(n, 0.f), v1(n, 0.f), m2(n, 0.f), v2(n, 0.f);
  for (int64_t t = 1; t <= 3; ++t) {
    auto g = test::randn(n, 20 + static_cast<uint32_t>(t));
    adamw_update_multi(p1.data(), g.data(), m1.data(), v1.data(), segs.data(),
                       static_cast<int64_t>(segs.size()), 1e-2f, 0.9f, 0.95f, 1e-8f, t);
    for (const AdamwSegment& s : segs)
      adamw_update(p2.data() + s.offset, g.data() + s.offset, m2.data() + s.offset,
                   v2.data() + s.offset, s.n, 1e-2f, 0.9f, 0.95f, 1e-8f, s.weight_decay, t);
  }
  EXPECT_EQ(p1, p2);
  EXPECT_EQ(m1, m2);
  EXPECT_EQ(v1, v2);
  const auto p0 = test::randn(n, 3);
  for (int64_t i = 107; i < 120; ++i)
    EXPECT_EQ(p1[i], p0[i]) << "element " << i << " is in no segment";
}

// Global-norm clipping folded into the update: the same bits as scaling the gradients first
// (kernels::scale, what the trainer did before) and updating with them, at any scale; 1
// leaves the gradients as they are.
TEST(AdamW, GradScaleIsBitwiseScalingTheGradientsFirst) {
  const int64_t n = 301;
  const std::vector<AdamwSegment> segs = {{0, 100, 0.1f}, {100, 7, 0.0f}, {120, 181, 0.1f}};
  for (float s : {1.0f, 0.3183f, 1e-3f}) {
    auto p1 = test::randn(n, 3), p2 = p1;
    std::vector<float> m1(n, 0.f), v1(n, 0.f), m2(n, 0.f), v2(n, 0.f);
    for (int64_t t = 1; t <= 3; ++t) {
      const auto g = test::randn(n, 40 + static_cast<uint32_t>(t));
      auto scaled = g;
      scale(scaled.data(), s, n);
      adamw_update_multi(p1.data(), g.data(), m1.data(), v1.data(), segs.data(),
                         static_cast<int64_t>(segs.size()), 1e-2f, 0.9f, 0.95f, 1e-8f, t, s);
      adamw_update_multi(p2.data(), scaled.data(), m2.data(), v2.data(), segs.data(),
                         static_cast<int64_t>(segs.size()), 1e-2f, 0.9f, 0.95f, 1e-8f, t);
    }
    EXPECT_EQ(p1, p2) << s;
    EXPECT_EQ(m1, m2) << s;
    EXPECT_EQ(v1, v2) << s;
  }
}

// A segment with a bf16 copy gets bf16(param) in the same pass, exactly as converting the
// updated values afterwards (ParamStore::refresh_bf16's to_bf16) gives; the values, moments
// and the segments without a copy are those of the update without one.
TEST(AdamW, Bf16CopyInThePassEqualsConvertingAfterwards) {
  const int64_t n = 301;
  std::vector<bf16> copy(static_cast<size_t>(n), bf16{0xFFFF}), after(copy);
  std::vector<AdamwSegment> with = {{0, 100, 0.1f}, {100, 7, 0.0f}, {120, 181, 0.1f}};
  const std::vector<AdamwSegment> without = with;
  with[0].bf16_out = copy.data();
  with[2].bf16_out = copy.data() + 120;
  auto p1 = test::randn(n, 3), p2 = p1;
  std::vector<float> m1(n, 0.f), v1(n, 0.f), m2(n, 0.f), v2(n, 0.f);
  for (int64_t t = 1; t <= 2; ++t) {
    const auto g = test::randn(n, 60 + static_cast<uint32_t>(t));
    adamw_update_multi(p1.data(), g.data(), m1.data(), v1.data(), with.data(),
                       static_cast<int64_t>(with.size()), 1e-2f, 0.9f, 0.95f, 1e-8f, t, 0.5f);
    adamw_update_multi(p2.data(), g.data(), m2.data(), v2.data(), without.data(),
                       static_cast<int64_t>(without.size()), 1e-2f, 0.9f, 0.95f, 1e-8f, t, 0.5f);
  }
  EXPECT_EQ(p1, p2);
  EXPECT_EQ(m1, m2);
  EXPECT_EQ(v1, v2);
  to_bf16(after.data(), p2.data(), 100);
  to_bf16(after.data() + 120, p2.data() + 120, 181);
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(copy[size_t(i)].bits, after[size_t(i)].bits) << "element " << i;
}

TEST(AdamW, RejectsStepZero) {
  float p = 0, g = 0, m = 0, v = 0;
  EXPECT_THROW(adamw_update(&p, &g, &m, &v, 1, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 0), mt::Error);
}

}  // namespace
}  // namespace mt::kernels

#include <gtest/gtest.h>

#include <cmath>

#include "kernels/kernels.h"
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

TEST(AdamW, RejectsStepZero) {
  float p = 0, g = 0, m = 0, v = 0;
  EXPECT_THROW(adamw_update(&p, &g, &m, &v, 1, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 0), mt::Error);
}

}  // namespace
}  // namespace mt::kernels

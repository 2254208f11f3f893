#include <gtest/gtest.h>

#include <cmath>

#include "kernels/kernels.h"
#include "kernels/test_util.h"

namespace mt::kernels {
namespace {

double ref_gelu(double x) {
  const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
  return 0.5 * x * (1.0 + std::tanh(u));
}

// The kernel uses a polynomial exp good to ~2 ulp plus a handful of float operations, so
// ~1e-6 relative; 1e-6 absolute covers values near zero where relative error is
// meaningless.
TEST(Gelu, ForwardMatchesReference) {
  auto x = test::randn(1000, 1, 3.0f);
  x.push_back(-100.0f);  // saturated tails: no overflow, no NaN
  x.push_back(100.0f);
  x.push_back(0.0f);
  std::vector<float> y(x.size());
  gelu_forward(y.data(), x.data(), static_cast<int64_t>(x.size()));
  std::vector<double> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = ref_gelu(x[i]);
  test::expect_close(y, want, 1e-6, 2e-6, "gelu");
}

TEST(Gelu, BackwardMatchesFiniteDifferences) {
  const int64_t n = 300;
  auto x = test::randn(n, 2, 3.0f), r = test::randn(n, 3);
  const auto xd = test::to_double(x), rd = test::to_double(r);
  auto g = test::numeric_grad(xd, [&](const auto& v) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += rd[i] * ref_gelu(v[i]);
    return s;
  });
  std::vector<float> dx(n);
  gelu_backward(dx.data(), x.data(), r.data(), n);
  // Same error budget as forward, times |r| ~ 1 and the derivative's O(1) size.
  test::expect_close(dx, g, 2e-6, 5e-6, "dx");
}

}  // namespace
}  // namespace mt::kernels

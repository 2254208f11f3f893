#include <gtest/gtest.h>

#include <cmath>

#include "kernels/kernels.h"
#include "kernels/test_util.h"

namespace mt::kernels {
namespace {

using test::randn;
using test::to_double;

std::vector<double> ref_layernorm(const std::vector<double>& x, const std::vector<double>& w,
                                  const std::vector<double>& b, int64_t n, int64_t c) {
  std::vector<double> y(n * c);
  for (int64_t i = 0; i < n; ++i) {
    double m = 0, v = 0;
    for (int64_t j = 0; j < c; ++j) m += x[i * c + j];
    m /= c;
    for (int64_t j = 0; j < c; ++j) v += (x[i * c + j] - m) * (x[i * c + j] - m);
    const double r = 1.0 / std::sqrt(v / c + 1e-5);
    for (int64_t j = 0; j < c; ++j) y[i * c + j] = (x[i * c + j] - m) * r * w[j] + b[j];
  }
  return y;
}

// Outputs are O(1) (normalised, times N(0,1) weights) and computed from float sums over c
// values: error a few 1e-7 relative; 2e-5 absolute plus 1e-5 relative leaves margin.
constexpr double kAtol = 2e-5, kRtol = 1e-5;

TEST(LayerNorm, ForwardMatchesReference) {
  const int64_t n = 5, c = 67;
  auto x = randn(n * c, 1, 2.0f), w = randn(c, 2), b = randn(c, 3);
  for (auto& v : x) v += 3.0f;  // an offset: the centring must be done right
  std::vector<float> y(n * c), mean(n), rstd(n);
  layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), n, c);
  test::expect_close(y, ref_layernorm(to_double(x), to_double(w), to_double(b), n, c), kAtol, kRtol,
                     "y");
}

TEST(LayerNorm, BackwardMatchesFiniteDifferences) {
  const int64_t n = 4, c = 70;  // c > 64: two column blocks in the dw/db reduction
  auto x = randn(n * c, 1), w = randn(c, 2), b = randn(c, 3), r = randn(n * c, 4);
  const auto xd = to_double(x), wd = to_double(w), bd = to_double(b), rd = to_double(r);
  auto gx = test::numeric_grad(
      xd, [&](const auto& v) { return test::dot(rd, ref_layernorm(v, wd, bd, n, c)); });
  auto gw = test::numeric_grad(
      wd, [&](const auto& v) { return test::dot(rd, ref_layernorm(xd, v, bd, n, c)); });
  auto gb = test::numeric_grad(
      bd, [&](const auto& v) { return test::dot(rd, ref_layernorm(xd, wd, v, n, c)); });
  std::vector<float> y(n * c), mean(n), rstd(n);
  layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), n, c);
  // All three accumulate: start from known values and add them to the expectation.
  std::vector<float> dx(n * c, 1.0f), dw(c, 2.0f), db(c, 3.0f);
  layernorm_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), mean.data(),
                     rstd.data(), n, c);
  for (auto& g : gx) g += 1.0;
  for (auto& g : gw) g += 2.0;
  for (auto& g : gb) g += 3.0;
  // dx sums c products of O(1) terms: ~c * 2^-24 * few ~ 1e-5; 5e-5 leaves margin.
  test::expect_close(dx, gx, 5e-5, 1e-5, "dx");
  test::expect_close(dw, gw, 5e-5, 1e-5, "dw");
  test::expect_close(db, gb, 5e-5, 1e-5, "db");
}

}  // namespace
}  // namespace mt::kernels

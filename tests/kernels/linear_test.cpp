#include <gtest/gtest.h>

#include "kernels/kernels.h"
#include "kernels/test_util.h"

namespace mt::kernels {
namespace {

using test::randn;
using test::to_double;

std::vector<double> ref_linear(const std::vector<double>& x, const std::vector<double>& w,
                               const std::vector<double>& b, int64_t n, int64_t in, int64_t out) {
  std::vector<double> y(n * out);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < out; ++o) {
      double s = b.empty() ? 0.0 : b[o];
      for (int64_t k = 0; k < in; ++k) s += x[i * in + k] * w[o * in + k];
      y[i * out + o] = s;
    }
  return y;
}

// Sums of <= 13 products of N(0,1) values in f32: error ~1e-6; 1e-5 leaves margin.
constexpr double kTol = 1e-5;

TEST(Linear, ForwardMatchesReference) {
  const int64_t n = 6, in = 13, out = 7;
  auto x = randn(n * in, 1), w = randn(out * in, 2), b = randn(out, 3);
  std::vector<float> y(n * out);
  linear_forward(y.data(), x.data(), w.data(), b.data(), n, in, out);
  test::expect_close(y, ref_linear(to_double(x), to_double(w), to_double(b), n, in, out), kTol, 0,
                     "y");
  linear_forward(y.data(), x.data(), w.data(), nullptr, n, in, out);
  test::expect_close(y, ref_linear(to_double(x), to_double(w), {}, n, in, out), kTol, 0,
                     "y (no bias)");
}

TEST(Linear, BackwardMatchesFiniteDifferences) {
  const int64_t n = 5, in = 6, out = 4;
  auto x = randn(n * in, 1), w = randn(out * in, 2), b = randn(out, 3), r = randn(n * out, 4);
  const auto xd = to_double(x), wd = to_double(w), bd = to_double(b), rd = to_double(r);
  auto gx = test::numeric_grad(
      xd, [&](const auto& v) { return test::dot(rd, ref_linear(v, wd, bd, n, in, out)); });
  auto gw = test::numeric_grad(
      wd, [&](const auto& v) { return test::dot(rd, ref_linear(xd, v, bd, n, in, out)); });
  auto gb = test::numeric_grad(
      bd, [&](const auto& v) { return test::dot(rd, ref_linear(xd, wd, v, n, in, out)); });
  std::vector<float> dx(n * in, 99.0f), dw(out * in, 0.5f), db(out, -0.25f);
  linear_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), n, in, out);
  // dx is overwritten; dw and db accumulate onto their previous values.
  for (auto& g : gw) g += 0.5;
  for (auto& g : gb) g += -0.25;
  test::expect_close(dx, gx, kTol, 1e-5, "dx");
  test::expect_close(dw, gw, kTol, 1e-5, "dw");
  test::expect_close(db, gb, kTol, 1e-5, "db");
}

}  // namespace
}  // namespace mt::kernels

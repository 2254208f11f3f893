#include <gtest/gtest.h>

#include <cmath>

#include "kernels/kernels.h"
#include "kernels/test_util.h"

namespace mt::kernels {
namespace {

using test::randn;

// Loss of each row over the first V of Vp columns, in double.
std::vector<double> ref_losses(const std::vector<double>& logits, const std::vector<int32_t>& t,
                               int64_t n, int64_t V, int64_t Vp) {
  std::vector<double> l(n);
  for (int64_t i = 0; i < n; ++i) {
    double mx = -1e300, s = 0;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, logits[i * Vp + j]);
    for (int64_t j = 0; j < V; ++j) s += std::exp(logits[i * Vp + j] - mx);
    l[i] = mx + std::log(s) - logits[i * Vp + t[i]];
  }
  return l;
}

struct Case {
  int64_t n = 5, V = 37, Vp = 48;
  std::vector<float> logits;
  std::vector<int32_t> targets;
  Case() {
    logits = randn(n * Vp, 1, 3.0f);
    for (int64_t i = 0; i < n; ++i) {
      targets.push_back(static_cast<int32_t>((i * 11 + 3) % V));
      // Padding holds large values: were they read, the loss would change a lot.
      for (int64_t j = V; j < Vp; ++j) logits[i * Vp + j] = 1000.0f;
    }
  }
};

TEST(CrossEntropy, ForwardIgnoresPadding) {
  Case c;
  std::vector<float> losses(c.n), lse(c.n);
  cross_entropy_forward(losses.data(), lse.data(), c.logits.data(), c.targets.data(), c.n, c.V,
                        c.Vp);
  // log-sum-exp of O(10) logits in float with a ~2 ulp exp: ~1e-6 relative.
  test::expect_close(losses, ref_losses(test::to_double(c.logits), c.targets, c.n, c.V, c.Vp), 1e-5,
                     1e-5, "losses");
}

TEST(CrossEntropy, BackwardMatchesFiniteDifferencesAndZeroesPadding) {
  Case c;
  const float dloss = 0.37f;  // the gradient of sum(losses) * dloss
  auto g = test::numeric_grad(test::to_double(c.logits), [&](const auto& v) {
    double s = 0;
    for (double l : ref_losses(v, c.targets, c.n, c.V, c.Vp)) s += l * dloss;
    return s;
  });
  for (int64_t i = 0; i < c.n; ++i)
    for (int64_t j = c.V; j < c.Vp; ++j) ASSERT_EQ(g[i * c.Vp + j], 0.0);
  std::vector<float> losses(c.n), lse(c.n), d(c.logits.size(), 55.0f);
  cross_entropy_forward(losses.data(), lse.data(), c.logits.data(), c.targets.data(), c.n, c.V,
                        c.Vp);
  cross_entropy_backward(d.data(), c.logits.data(), lse.data(), c.targets.data(), dloss, c.n, c.V,
                         c.Vp);
  // Probabilities in [0, 1] to ~1e-6 relative (exp of a float difference).
  test::expect_close(d, g, 1e-6, 1e-5, "dlogits");
  // In place gives the same bits.
  auto inplace = c.logits;
  cross_entropy_backward(inplace.data(), inplace.data(), lse.data(), c.targets.data(), dloss, c.n,
                         c.V, c.Vp);
  EXPECT_EQ(inplace, d);
}

TEST(CrossEntropy, WideVocabularyIsStable) {
  // GPT-2's padded vocabulary, large logits: max-subtraction keeps exp finite.
  const int64_t n = 2, V = 50257, Vp = 50304;
  auto logits = randn(n * Vp, 2, 30.0f);
  std::vector<int32_t> t = {0, 50256};
  std::vector<float> losses(n), lse(n);
  cross_entropy_forward(losses.data(), lse.data(), logits.data(), t.data(), n, V, Vp);
  // A float sum of 50k terms: ~sqrt(V) * 2^-24 relative on the sum, far below 1e-4 on loss.
  test::expect_close(losses, ref_losses(test::to_double(logits), t, n, V, Vp), 1e-4, 1e-5,
                     "losses");
}

TEST(CrossEntropy, RejectsOutOfRangeTarget) {
  std::vector<float> logits(8), losses(1), lse(1);
  std::vector<int32_t> t = {5};
  EXPECT_THROW(cross_entropy_forward(losses.data(), lse.data(), logits.data(), t.data(), 1, 5, 8),
               mt::Error);
}

}  // namespace
}  // namespace mt::kernels

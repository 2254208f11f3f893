// Same inputs, same thread count: same bits. Kernels whose reductions are split by
// columns (layer norm dw/db, bias grad, embedding grads) or by fixed chunks (sum_squares)
// give the same bits at any thread count, which is checked too.
#include <gtest/gtest.h>

#include <functional>

#include "kernels/kernels.h"
#include "kernels/test_util.h"

namespace mt::kernels {
namespace {

// Runs fn at `threads` threads and returns the output it fills.
std::vector<float> at_threads(int n, const std::function<std::vector<float>()>& fn) {
  const int saved = threads();
  set_threads(n);
  auto out = fn();
  set_threads(saved);
  return out;
}

TEST(Determinism, BackwardReductionsAreThreadCountIndependent) {
  const int64_t n = 64, c = 200, V = 50, B = 4, T = 16;
  auto x = test::randn(n * c, 1), w = test::randn(c, 2), b = test::randn(c, 3),
       dy = test::randn(n * c, 4);
  auto layernorm_grads = [&] {
    std::vector<float> y(n * c), mean(n), rstd(n), dx(n * c), dw(c), db(c);
    layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), n, c);
    layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(),
                       rstd.data(), n, c);
    std::vector<float> out = dx;
    out.insert(out.end(), dw.begin(), dw.end());
    out.insert(out.end(), db.begin(), db.end());
    return out;
  };
  std::vector<int32_t> tok(B * T);
  for (int64_t i = 0; i < B * T; ++i) tok[i] = static_cast<int32_t>((i * 7) % 5);  // repeats
  auto emb_grads = [&] {
    std::vector<float> dwte(V * c), dwpe(T * c);
    embedding_backward(dwte.data(), dwpe.data(), dy.data(), tok.data(), B, T, c);
    dwte.insert(dwte.end(), dwpe.begin(), dwpe.end());
    return dwte;
  };
  auto wl = test::randn(c * c, 5);
  auto linear_bias_grad = [&] {
    std::vector<float> dw(c * c), db(c);
    linear_backward(nullptr, dw.data(), db.data(), dy.data(), x.data(), wl.data(), n, c, c);
    return db;
  };
  EXPECT_EQ(at_threads(2, layernorm_grads), at_threads(2, layernorm_grads));
  EXPECT_EQ(at_threads(1, layernorm_grads), at_threads(2, layernorm_grads));
  EXPECT_EQ(at_threads(2, emb_grads), at_threads(2, emb_grads));
  EXPECT_EQ(at_threads(1, emb_grads), at_threads(2, emb_grads));
  EXPECT_EQ(at_threads(1, linear_bias_grad), at_threads(2, linear_bias_grad));
}

TEST(Determinism, CrossEntropySameBitsTwice) {
  const int64_t n = 8, V = 1000, Vp = 1024;
  auto logits = test::randn(n * Vp, 1, 3.0f);
  std::vector<int32_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>(i * 97 % V);
  auto run = [&] {
    std::vector<float> losses(n), lse(n), d(n * Vp);
    cross_entropy_forward(losses.data(), lse.data(), logits.data(), t.data(), n, V, Vp);
    cross_entropy_backward(d.data(), logits.data(), lse.data(), t.data(), 1.0f, n, V, Vp);
    d.insert(d.end(), losses.begin(), losses.end());
    return d;
  };
  EXPECT_EQ(at_threads(2, run), at_threads(2, run));
  // Rows are independent, so the thread count does not change them either.
  EXPECT_EQ(at_threads(1, run), at_threads(2, run));
}

}  // namespace
}  // namespace mt::kernels

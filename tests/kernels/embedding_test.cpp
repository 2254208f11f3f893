#include <gtest/gtest.h>

#include "kernels/kernels.h"
#include "kernels/test_util.h"

namespace mt::kernels {
namespace {

TEST(Embedding, ForwardAndBackward) {
  const int64_t B = 3, T = 4, C = 70, V = 5;  // C > 64: two column blocks
  auto wte = test::randn(V * C, 1), wpe = test::randn(T * C, 2), r = test::randn(B * T * C, 3);
  std::vector<int32_t> tok = {0, 1, 1, 4, 2, 2, 2, 0, 4, 4, 1, 3};  // repeated tokens
  std::vector<float> y(B * T * C);
  embedding_forward(y.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
  std::vector<double> want(y.size());
  std::vector<double> gte(V * C, 0.5), gpe(T * C, -1.0);  // accumulate onto these
  for (int64_t i = 0; i < B * T; ++i)
    for (int64_t j = 0; j < C; ++j) {
      want[i * C + j] = double(wte[tok[i] * C + j]) + wpe[(i % T) * C + j];
      // The embedding is linear, so the exact gradient of sum(r * y) is a scatter of r.
      gte[tok[i] * C + j] += r[i * C + j];
      gpe[(i % T) * C + j] += r[i * C + j];
    }
  // One float addition of two values (exact up to 1 ulp of an O(1) result).
  test::expect_close(y, want, 1e-6, 1e-6, "y");
  std::vector<float> dwte(V * C, 0.5f), dwpe(T * C, -1.0f);
  embedding_backward(dwte.data(), dwpe.data(), r.data(), tok.data(), B, T, C);
  // Up to B*T = 12 float additions of O(1) values: ~12 * 2^-24 * 4 ~ 3e-6.
  test::expect_close(dwte, gte, 1e-5, 1e-6, "dwte");
  test::expect_close(dwpe, gpe, 1e-5, 1e-6, "dwpe");
  // dwpe may be null.
  embedding_backward(dwte.data(), nullptr, r.data(), tok.data(), B, T, C);
}

}  // namespace
}  // namespace mt::kernels

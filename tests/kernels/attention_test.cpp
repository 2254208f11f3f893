#include <gtest/gtest.h>

#include <cmath>

#include "kernels/kernels.h"
#include "kernels/test_util.h"

namespace mt::kernels {
namespace {

using test::randn;
using test::to_double;

// Causal attention in double; att (if given) receives the probabilities.
std::vector<double> ref_attention(const std::vector<double>& qkv, int64_t B, int64_t T, int64_t C,
                                  int64_t NH, std::vector<double>* att = nullptr) {
  const int64_t hd = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<double> out(B * T * C, 0.0), p(T);
  if (att) att->assign(B * NH * T * T, 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const double* q = &qkv[(b * T + t) * 3 * C + h * hd];
        double mx = -1e300;
        for (int64_t j = 0; j <= t; ++j) {
          const double* k = &qkv[(b * T + j) * 3 * C + C + h * hd];
          double s = 0;
          for (int64_t d = 0; d < hd; ++d) s += q[d] * k[d];
          p[j] = s * scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j <= t; ++j) sum += (p[j] = std::exp(p[j] - mx));
        for (int64_t j = 0; j <= t; ++j) {
          p[j] /= sum;
          if (att) (*att)[((b * NH + h) * T + t) * T + j] = p[j];
          const double* v = &qkv[(b * T + j) * 3 * C + 2 * C + h * hd];
          for (int64_t d = 0; d < hd; ++d) out[(b * T + t) * C + h * hd + d] += p[j] * v[d];
        }
      }
  return out;
}

TEST(Attention, ForwardMatchesReference) {
  // T = 150 spans three row blocks of the kernel (64, 64, 22).
  const int64_t B = 2, T = 150, NH = 3, C = 12;
  auto qkv = randn(B * T * 3 * C, 1);
  std::vector<float> out(B * T * C), att(B * NH * T * T, 99.0f);
  attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  std::vector<double> want_att;
  auto want = ref_attention(to_double(qkv), B, T, C, NH, &want_att);
  // Probabilities in [0, 1] from a polynomial exp (~2 ulp) and float sums of <= T terms:
  // ~T * 2^-24 ~ 1e-5 relative at worst; outputs are averages of N(0,1) values.
  test::expect_close(att, want_att, 2e-6, 1e-5, "att (0 above the diagonal)");
  test::expect_close(out, want, 1e-5, 1e-5, "out");
}

TEST(Attention, BackwardMatchesFiniteDifferences) {
  // T = 70: a full and a partial block in both the row and the column passes.
  const int64_t B = 2, T = 70, NH = 2, C = 6;
  auto qkv = randn(B * T * 3 * C, 2), r = randn(B * T * C, 3);
  const auto qd = to_double(qkv), rd = to_double(r);
  auto g = test::numeric_grad(
      qd, [&](const auto& v) { return test::dot(rd, ref_attention(v, B, T, C, NH)); });
  std::vector<float> out(B * T * C), att(B * NH * T * T), scratch(B * NH * T * T);
  attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  std::vector<float> dqkv(qkv.size(), 123.0f);  // overwritten
  attention_backward(dqkv.data(), scratch.data(), r.data(), qkv.data(), att.data(), B, T, C, NH);
  // Gradients are sums over <= T keys of O(1) terms in float: ~T * 2^-24 * few ~ 2e-5.
  test::expect_close(dqkv, g, 5e-5, 1e-4, "dqkv");
}

TEST(Attention, SameBitsTwice) {
  const int64_t B = 2, T = 100, NH = 4, C = 32;
  auto qkv = randn(B * T * 3 * C, 5), dout = randn(B * T * C, 6);
  std::vector<float> o1(B * T * C), o2(o1.size()), a1(B * NH * T * T), a2(a1.size());
  std::vector<float> s(a1.size()), d1(qkv.size()), d2(qkv.size());
  attention_forward(o1.data(), a1.data(), qkv.data(), B, T, C, NH);
  attention_forward(o2.data(), a2.data(), qkv.data(), B, T, C, NH);
  attention_backward(d1.data(), s.data(), dout.data(), qkv.data(), a1.data(), B, T, C, NH);
  attention_backward(d2.data(), s.data(), dout.data(), qkv.data(), a1.data(), B, T, C, NH);
  EXPECT_EQ(o1, o2);
  EXPECT_EQ(a1, a2);
  EXPECT_EQ(d1, d2);
}

}  // namespace
}  // namespace mt::kernels

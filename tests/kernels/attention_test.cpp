#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "kernels/bf16_tiles.h"
#include "kernels/kernels.h"
#include "kernels/mixed.h"
#include "kernels/test_util.h"

namespace mt::kernels {
namespace {

using test::randn;
using test::rounded;
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

// ---- bf16 GEMM operands (attention_forward_mixed / attention_backward_mixed) ----------------

std::vector<float> widened(const std::vector<bf16>& x) {
  std::vector<float> y(x.size());
  to_f32(y.data(), x.data(), static_cast<int64_t>(x.size()));
  return y;
}

// Runs `check` under each schedule of the mixed kernels this CPU has (attention_mixed.cpp):
// the hand-written tiles where AVX512-BF16 is there without AMX, and oneDNN's GEMMs always.
template <class Check>
void for_each_schedule(Check check) {
  std::vector<const char*> schedules = {"0"};
  if (tiles::cpu_supports()) schedules.push_back("1");
  for (const char* s : schedules) {
    SCOPED_TRACE(std::string("MT_BF16_TILES=") + s);
    setenv("MT_BF16_TILES", s, 1);
    check();
  }
  unsetenv("MT_BF16_TILES");
}

// Each |got - want| against its bound; returns the largest |got - want| / bound (<= 1 passes).
double worst_ratio(const std::vector<float>& got, const std::vector<float>& want,
                   const std::vector<double>& bound, const char* what) {
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double r = std::fabs(double(got[i]) - want[i]) / bound[i];
    if (!(r <= 1.0)) {
      ADD_FAILURE() << what << "[" << i << "]: " << got[i] << " vs " << want[i] << ", bound "
                    << bound[i];
      return r;
    }
    worst = std::max(worst, r);
  }
  return worst;
}

// The mixed kernel on bf16 q, k, v is the f32 kernel on the same (widened) values but for
// the rounding of the probabilities P·V reads: P rounded to nearest is within 2^-8·p of p (bf16
// keeps 8 significant bits), so |Δo[t, d]| <= 2^-8 Σ_j p_tj |v_jd|. Both accumulate in f32, in
// different orders: 2^-24 · (hd or t) terms of the same sums, < 2^-15 of them here, so the bound is
// (2^-8 + 2^-15) Σ_j p_tj |v_jd| + 1e-7. The probabilities themselves come from the same rounded
// operands: scores within hd · 2^-24 · Σ|q||k| (f32 order), so att within 1e-5 relative + 1e-7. A
// defect (a key block skipped, a wrong scale, one head's values read for another) moves an output
// by O(Σ p|v|), hundreds of times the bound; the largest error is checked to be a sizable part of
// it (> 2^-4), so the bound is not loose either.
TEST(AttentionMixed, ForwardIsTheF32KernelUpToTheRoundedProbabilities) {
  for_each_schedule([&] {
    const int64_t B = 2, T = 150, NH = 3, C = 48, hd = C / NH;  // three row blocks: 64, 64, 22
    const auto qkv_b = rounded(randn(B * T * 3 * C, 11));
    const auto qkv = widened(qkv_b);
    std::vector<float> want(B * T * C), want_att(B * NH * T * T);
    std::vector<float> got(B * T * C, 7.0f), got_att(B * NH * T * T, 7.0f);
    attention_forward(want.data(), want_att.data(), qkv.data(), B, T, C, NH);
    attention_forward_mixed(got.data(), got_att.data(), qkv_b.data(), B, T, C, NH);
    test::expect_close(got_att.data(), to_double(want_att).data(), got_att.size(), 1e-7, 1e-5,
                       "att");
    std::vector<double> bound(got.size());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < NH; ++h)
        for (int64_t t = 0; t < T; ++t)
          for (int64_t d = 0; d < hd; ++d) {
            double m = 0;
            for (int64_t j = 0; j <= t; ++j)
              m += want_att[((b * NH + h) * T + t) * T + j] *
                   std::fabs(qkv[(b * T + j) * 3 * C + 2 * C + h * hd + d]);
            bound[(b * T + t) * C + h * hd + d] = (0x1p-8 + 0x1p-15) * m + 1e-7;
          }
    EXPECT_GT(worst_ratio(got, want, bound, "out"), 0x1p-4);
  });
}

// The backward on bf16 dO, q, k, v against the f32 kernel on the same values, from the same
// probabilities. dP = dO·Vᵀ and the softmax backward see the same operands (f32 order only),
// then dQ = dS·K, dK = dSᵀ·Q and dV = Pᵀ·dO read dS and P rounded: |ΔdQ[t, d]| <= 2^-8
// Σ_j |dS_tj| |k_jd|, |ΔdK[j, d]| <= 2^-8 Σ_t |dS_tj| |q_td|, |ΔdV[j, d]| <= 2^-8 Σ_t p_tj
// |dO_td|, each with 2^-15 of the same sum for the f32 orders (dS itself moves by
// hd · 2^-24 relative through dP) and 1e-7.
TEST(AttentionMixed, BackwardIsTheF32KernelUpToTheRoundedScoresAndProbabilities) {
  for_each_schedule([&] {
    const int64_t B = 2, T = 70, NH = 2, C = 32, hd = C / NH;  // a full and a partial block
    const auto qkv_b = rounded(randn(B * T * 3 * C, 12));
    const auto dout_b = rounded(randn(B * T * C, 13));
    const auto qkv = widened(qkv_b), dout = widened(dout_b);
    std::vector<float> out(B * T * C), att(B * NH * T * T);
    attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    std::vector<float> want(qkv.size()), ds(B * NH * T * T, 0.0f);
    attention_backward(want.data(), ds.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
    std::vector<float> got(qkv.size(), 7.0f), scratch(ds.size(), 7.0f);
    attention_backward_mixed(got.data(), scratch.data(), dout_b.data(), qkv_b.data(), att.data(), B,
                             T, C, NH);
    // ds: the f32 kernel's dS, rows t over [0, t] (the rest is 0 or unread).
    auto at = [&](int64_t b, int64_t t, int64_t part, int64_t h, int64_t d) {
      return qkv[(b * T + t) * 3 * C + part * C + h * hd + d];
    };
    std::vector<double> bound(got.size());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < NH; ++h) {
        const float* p = att.data() + (b * NH + h) * T * T;
        const float* s = ds.data() + (b * NH + h) * T * T;
        for (int64_t i = 0; i < T; ++i)
          for (int64_t d = 0; d < hd; ++d) {
            double mq = 0, mk = 0, mv = 0;
            for (int64_t j = 0; j <= i; ++j)
              mq += std::fabs(s[i * T + j]) * std::fabs(at(b, j, 1, h, d));
            for (int64_t t = i; t < T; ++t) {
              mk += std::fabs(s[t * T + i]) * std::fabs(at(b, t, 0, h, d));
              mv += p[t * T + i] * std::fabs(dout[(b * T + t) * C + h * hd + d]);
            }
            const int64_t row = (b * T + i) * 3 * C + h * hd + d;
            bound[row] = (0x1p-8 + 0x1p-15) * mq + 1e-7;
            bound[row + C] = (0x1p-8 + 0x1p-15) * mk + 1e-7;
            bound[row + 2 * C] = (0x1p-8 + 0x1p-15) * mv + 1e-7;
          }
      }
    EXPECT_GT(worst_ratio(got, want, bound, "dqkv"), 0x1p-4);
  });
}

// The bf16 output (c_proj's input under --dtype bf16) is the f32 output rounded once: to_bf16's
// bits, element for element, and the same probabilities. An output row block left unwritten,
// or rounded from the wrong rows of the thread's f32 block, differs in whole elements.
TEST(AttentionMixed, Bf16OutputIsTheF32OutputRounded) {
  for_each_schedule([&] {
    const int64_t B = 2, T = 150, NH = 3, C = 48;  // three row blocks: 64, 64, 22
    const auto qkv = rounded(randn(B * T * 3 * C, 16));
    std::vector<float> o(B * T * C), a1(B * NH * T * T), a2(a1.size(), 7.0f);
    std::vector<bf16> want(o.size()), got(o.size(), f32_to_bf16(7.0f));
    attention_forward_mixed(o.data(), a1.data(), qkv.data(), B, T, C, NH);
    attention_forward_mixed(got.data(), a2.data(), qkv.data(), B, T, C, NH);
    to_bf16(want.data(), o.data(), static_cast<int64_t>(o.size()));
    EXPECT_EQ(a1, a2);
    for (size_t i = 0; i < o.size(); ++i) ASSERT_EQ(got[i].bits, want[i].bits) << "at " << i;
  });
}

TEST(AttentionMixed, SameBitsTwice) {
  for_each_schedule([&] {
    const int64_t B = 2, T = 100, NH = 4, C = 32;
    const auto qkv = rounded(randn(B * T * 3 * C, 14)), dout = rounded(randn(B * T * C, 15));
    std::vector<float> o1(B * T * C), o2(o1.size()), a1(B * NH * T * T), a2(a1.size());
    std::vector<float> s(a1.size()), d1(qkv.size()), d2(qkv.size());
    attention_forward_mixed(o1.data(), a1.data(), qkv.data(), B, T, C, NH);
    attention_forward_mixed(o2.data(), a2.data(), qkv.data(), B, T, C, NH);
    attention_backward_mixed(d1.data(), s.data(), dout.data(), qkv.data(), a1.data(), B, T, C, NH);
    attention_backward_mixed(d2.data(), s.data(), dout.data(), qkv.data(), a1.data(), B, T, C, NH);
    EXPECT_EQ(o1, o2);
    EXPECT_EQ(a1, a2);
    EXPECT_EQ(d1, d2);
  });
}

}  // namespace
}  // namespace mt::kernels

// The Llama family's kernels (RMSNorm, rotary embeddings, SwiGLU, grouped-query kv heads)
// against double-precision references written from Hugging Face's formulas, and their
// backward passes against central finite differences of those references.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/test_util.h"
#include "model/rope.h"

namespace mt::kernels {
namespace {

using test::randn;
using test::to_double;

// ---- RMSNorm: LlamaRMSNorm, x · rsqrt(mean(x²) + eps) · w ------------------------------
std::vector<double> ref_rmsnorm(const std::vector<double>& x, const std::vector<double>& w,
                                int64_t n, int64_t c, double eps) {
  std::vector<double> y(n * c);
  for (int64_t i = 0; i < n; ++i) {
    double s = 0;
    for (int64_t j = 0; j < c; ++j) s += x[i * c + j] * x[i * c + j];
    const double r = 1.0 / std::sqrt(s / c + eps);
    for (int64_t j = 0; j < c; ++j) y[i * c + j] = x[i * c + j] * r * w[j];
  }
  return y;
}

// Outputs O(1) from float sums over c values: a few 1e-7 relative; the layer-norm test's
// 2e-5 / 1e-5 (tests/kernels/layernorm_test.cpp). A missing eps or a wrong mean (c vs c-1)
// is 1e-2 off at c = 67.
TEST(RmsNorm, ForwardMatchesReference) {
  const int64_t n = 5, c = 67;
  auto x = randn(n * c, 1, 2.0f), w = randn(c, 2);
  for (auto& v : x) v += 1.0f;  // no centring: an offset changes the result
  std::vector<float> y(n * c), rstd(n);
  rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), n, c, 1e-5f);
  test::expect_close(y, ref_rmsnorm(to_double(x), to_double(w), n, c, 1e-5), 2e-5, 1e-5, "y");
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  const int64_t n = 4, c = 70;  // c > 64: two column blocks in the dw reduction
  const double eps = 1e-5;
  auto x = randn(n * c, 1), w = randn(c, 2), r = randn(n * c, 4);
  const auto xd = to_double(x), wd = to_double(w), rd = to_double(r);
  auto gx = test::numeric_grad(
      xd, [&](const auto& v) { return test::dot(rd, ref_rmsnorm(v, wd, n, c, eps)); });
  auto gw = test::numeric_grad(
      wd, [&](const auto& v) { return test::dot(rd, ref_rmsnorm(xd, v, n, c, eps)); });
  std::vector<float> y(n * c), rstd(n);
  rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), n, c, static_cast<float>(eps));
  // Both accumulate: start from known values.
  std::vector<float> dx(n * c, 1.0f), dw(c, 2.0f);
  rmsnorm_backward(dx.data(), dw.data(), r.data(), x.data(), w.data(), rstd.data(), n, c);
  for (auto& g : gx) g += 1.0;
  for (auto& g : gw) g += 2.0;
  // As layer norm's: sums of c O(1) products, ~1e-5; 5e-5 leaves margin.
  test::expect_close(dx, gx, 5e-5, 1e-5, "dx");
  test::expect_close(dw, gw, 5e-5, 1e-5, "dw");
}

// ---- rotary embeddings: q·cos + rotate_half(q)·sin, rotate_half(x) = [-x2, x1] -------------
// The reference builds HF's full-width cos/sin (the hd/2 frequencies repeated twice).
std::vector<double> ref_rope(const std::vector<double>& x, int64_t B, int64_t T, int64_t stride,
                             int64_t col0, int64_t heads, int64_t hd,
                             const std::vector<double>& inv_freq) {
  std::vector<double> y = x;
  const int64_t half = hd / 2;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t o = (b * T + t) * stride + col0 + h * hd;
        for (int64_t i = 0; i < hd; ++i) {
          const double a = t * inv_freq[i % half];
          const double rot = i < half ? -x[o + i + half] : x[o + i - half];
          y[o + i] = x[o + i] * std::cos(a) + rot * std::sin(a);
        }
      }
  return y;
}

model::GptConfig rope_config(int64_t hd, double theta, bool llama3) {
  model::GptConfig c;
  c.n_head = 1;
  c.d_model = hd;
  c.rope_theta = theta;
  c.rope_scaling.llama3 = llama3;
  c.rope_scaling.factor = 8;
  c.rope_scaling.original_max_position = 64;  // small, so that all three bands occur
  return c;
}

TEST(Rope, ForwardAndBackwardMatchTheReference) {
  // Rows of [q (2 heads) | k (1 head) | v], hd 8: the kernel turns q's heads, leaves v alone.
  const int64_t B = 2, T = 5, hd = 8, stride = 4 * hd;
  for (const bool llama3 : {false, true}) {
    const model::GptConfig c = rope_config(hd, 100.0, llama3);
    const std::vector<double> f = model::rope_inv_freq(c);
    const model::RopeTables tab = model::make_rope_tables(c, T);
    auto x = randn(B * T * stride, 3);
    std::vector<float> y = x;
    rope_forward(y.data(), B, T, stride, 0, 2, hd, tab.cos.f32(), tab.sin.f32());
    // Angles up to 4 rad, cos/sin rounded to f32: ~1e-7 relative per product.
    test::expect_close(y, ref_rope(to_double(x), B, T, stride, 0, 2, hd, f), 1e-6, 1e-6, "y");
    // Backward: the gradient of <r, rope(x)> is rope's transpose applied to r.
    auto r = randn(B * T * stride, 4);
    auto g = test::numeric_grad(to_double(x), [&](const auto& v) {
      return test::dot(to_double(r), ref_rope(v, B, T, stride, 0, 2, hd, f));
    });
    std::vector<float> dx = r;
    rope_backward(dx.data(), B, T, stride, 0, 2, hd, tab.cos.f32(), tab.sin.f32());
    test::expect_close(dx, g, 1e-6, 1e-6, "dx");
  }
}

TEST(Rope, Llama3ScalingFollowsHuggingFace) {
  // _compute_llama3_parameters, written out here in double: wavelengths above
  // original/low_freq_factor divided by factor, below original/high_freq_factor kept,
  // between (1 - s)·f/factor + s·f with s = (original/wavelen - low) / (high - low).
  const int64_t hd = 64;
  const model::GptConfig c = rope_config(hd, 500000.0, true);
  const std::vector<double> got = model::rope_inv_freq(c);
  ASSERT_EQ(got.size(), size_t(hd / 2));
  int low = 0, mid = 0, high = 0;
  for (int64_t i = 0; i < hd / 2; ++i) {
    const double f = std::pow(500000.0, -2.0 * i / hd), wl = 2 * std::numbers::pi / f;
    double want = f;
    if (wl > 64.0 / 1.0) {
      want = f / 8;
      ++low;
    } else if (wl >= 64.0 / 4.0) {
      const double s = (64.0 / wl - 1.0) / (4.0 - 1.0);
      want = (1 - s) * f / 8 + s * f;
      ++mid;
    } else {
      ++high;
    }
    EXPECT_DOUBLE_EQ(got[size_t(i)], want) << i;
  }
  EXPECT_GT(low, 0);  // every band is exercised
  EXPECT_GT(mid, 0);
  EXPECT_GT(high, 0);
  // Without scaling, plain theta^(-2i/hd).
  const std::vector<double> plain = model::rope_inv_freq(rope_config(hd, 500000.0, false));
  for (int64_t i = 0; i < hd / 2; ++i)
    EXPECT_DOUBLE_EQ(plain[size_t(i)], std::pow(500000.0, -2.0 * i / hd));
}

// ---- SwiGLU: silu(gate) · up ------------------------------------------------------------
std::vector<double> ref_swiglu(const std::vector<double>& h, int64_t n, int64_t f) {
  std::vector<double> y(n * f);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < f; ++j) {
      const double g = h[i * 2 * f + j], u = h[i * 2 * f + f + j];
      y[i * f + j] = g / (1 + std::exp(-g)) * u;
    }
  return y;
}

TEST(SwiGlu, ForwardAndBackwardMatchTheReference) {
  const int64_t n = 3, f = 9;
  auto h = randn(n * 2 * f, 5, 2.0f), r = randn(n * f, 6);
  std::vector<float> y(n * f);
  swiglu_forward(y.data(), h.data(), n, f);
  test::expect_close(y, ref_swiglu(to_double(h), n, f), 1e-6, 1e-6, "y");
  auto g = test::numeric_grad(
      to_double(h), [&](const auto& v) { return test::dot(to_double(r), ref_swiglu(v, n, f)); });
  std::vector<float> dh(n * 2 * f, 7.0f);  // overwritten
  swiglu_backward(dh.data(), h.data(), r.data(), n, f);
  test::expect_close(dh, g, 1e-5, 1e-5, "dh");
}

// ---- grouped-query kv heads -------------------------------------------------------------
TEST(KvHeads, ExpandRepeatsEachKvHeadForItsGroupAndReduceIsItsTranspose) {
  const int64_t n = 3, heads = 6, kv = 2, hd = 4, C = heads * hd, Ckv = kv * hd;
  auto x = randn(n * (C + 2 * Ckv), 7);
  std::vector<float> full(n * 3 * C);
  expand_kv_heads(full.data(), x.data(), n, heads, kv, hd);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t j = 0; j < hd; ++j) {
        const float* src = x.data() + i * (C + 2 * Ckv);
        const float* dst = full.data() + i * 3 * C;
        ASSERT_EQ(dst[h * hd + j], src[h * hd + j]);                          // q as is
        ASSERT_EQ(dst[C + h * hd + j], src[C + (h / 3) * hd + j]);            // k: head h/g
        ASSERT_EQ(dst[2 * C + h * hd + j], src[C + Ckv + (h / 3) * hd + j]);  // v likewise
      }
  // <expand(x), y> = <x, reduce(y)>: reduce is expand's transpose (the gradient).
  auto y = randn(n * 3 * C, 8);
  std::vector<float> back(x.size());
  reduce_kv_heads(back.data(), y.data(), n, heads, kv, hd);
  double lhs = 0, rhs = 0;
  for (size_t i = 0; i < full.size(); ++i) lhs += double(full[i]) * y[i];
  for (size_t i = 0; i < x.size(); ++i) rhs += double(x[i]) * back[i];
  EXPECT_NEAR(lhs, rhs, 1e-4 * std::abs(lhs) + 1e-4);
}

}  // namespace
}  // namespace mt::kernels

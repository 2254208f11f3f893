#include "kernels/mixed.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/memory.h"
#include "kernels/kernels.h"
#include "kernels/test_util.h"
#include "kernels/vocab_parallel.h"
// Every heap allocation of this process is counted (malloc and operator new).
#include "alloc_count.h"

namespace mt::kernels {
namespace {

using test::randn;

constexpr double kU32 = 0x1p-24;  // unit roundoff of f32
constexpr double kU16 = 0x1p-8;   // unit roundoff of bf16 (8 significant bits)

uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float f32_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::vector<bf16> rounded(const std::vector<float>& x) {
  std::vector<bf16> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = f32_to_bf16(x[i]);
  return y;
}
std::vector<double> widened(const std::vector<bf16>& x) {
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = bf16_to_f32(x[i]);
  return y;
}

// ---- conversions ------------------------------------------------------------------------

uint16_t convert_one(uint32_t f_bits) {
  const float f = f32_of(f_bits);
  bf16 y;
  to_bf16(&y, &f, 1);
  return y.bits;
}

TEST(MixedConvert, RoundsToNearestTiesToEven) {
  // 1 + 2^-8 is halfway between 1 (0x3f80, even) and 1 + 2^-7 (0x3f81): down to even.
  EXPECT_EQ(convert_one(0x3f808000u), 0x3f80);
  // Halfway between 0x3f81 (odd) and 0x3f82: up to even.
  EXPECT_EQ(convert_one(0x3f818000u), 0x3f82);
  EXPECT_EQ(convert_one(0x3f808001u), 0x3f81);  // just above the tie: up
  EXPECT_EQ(convert_one(0x3f807fffu), 0x3f80);  // just below: down
  EXPECT_EQ(convert_one(0xbf808000u), 0xbf80);  // negative ties go to even too
  EXPECT_EQ(convert_one(0xbf818000u), 0xbf82);
  // Subnormals are rounded, not flushed to zero (VCVTNEPS2BF16 would flush them).
  EXPECT_EQ(convert_one(0x00010000u), 0x0001);
  EXPECT_EQ(convert_one(0x00018000u), 0x0002);
  EXPECT_EQ(convert_one(0x00008000u), 0x0000);
  EXPECT_EQ(convert_one(0x80018000u), 0x8002);
}

TEST(MixedConvert, InfinityNanAndOverflow) {
  EXPECT_EQ(convert_one(0x7f800000u), 0x7f80);  // +inf
  EXPECT_EQ(convert_one(0xff800000u), 0xff80);  // -inf
  EXPECT_EQ(convert_one(0x7fc00000u), 0x7fc0);  // quiet NaN
  // A NaN whose payload is only in the low 16 bits must not truncate to inf.
  EXPECT_EQ(convert_one(0x7f800001u), 0x7fc0);
  EXPECT_EQ(convert_one(0xff800001u), 0xffc0);
  EXPECT_EQ(convert_one(0x7fbfffffu), 0x7fff);  // a signalling NaN is made quiet
  // The largest bf16 is 0x7f7f; f32 values from half an ulp above it round to inf.
  EXPECT_EQ(convert_one(0x7f7f7fffu), 0x7f7f);
  EXPECT_EQ(convert_one(0x7f7f8000u), 0x7f80);
  EXPECT_EQ(convert_one(f32_bits(std::numeric_limits<float>::max())), 0x7f80);
  EXPECT_EQ(convert_one(0x80000000u), 0x8000);  // -0 keeps its sign
}

bool is_nan_bits(uint16_t b) { return (b & 0x7fffu) > 0x7f80u; }

TEST(MixedConvert, EveryBf16RoundTripsExactly) {
  std::vector<bf16> all(65536), back(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i].bits = static_cast<uint16_t>(i);
  std::vector<float> f(65536);
  to_f32(f.data(), all.data(), 65536);  // above the parallel threshold: the threaded path
  to_bf16(back.data(), f.data(), 65536);
  for (uint32_t i = 0; i < 65536; ++i) {
    ASSERT_EQ(f32_bits(f[i]), i << 16) << "to_f32 of bf16 bits " << i;
    if (is_nan_bits(static_cast<uint16_t>(i))) {  // NaNs stay NaN, same sign, made quiet
      ASSERT_EQ(back[i].bits, i | 0x40u) << i;
    } else {
      ASSERT_EQ(back[i].bits, i) << "round trip of bf16 bits " << i;
    }
  }
}

TEST(MixedConvert, MatchesScalarConversion) {
  // Every sign and exponent and top mantissa bits (the high half), with the low halves
  // that decide rounding (exact, just below / at / above the tie, all ones), then random
  // bit patterns; array lengths with a vector tail, on the threaded and unthreaded paths.
  const uint32_t lows[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff};
  std::vector<float> x;
  for (uint32_t hi = 0; hi < 65536; ++hi)
    for (uint32_t lo : lows) x.push_back(f32_of(hi << 16 | lo));
  std::mt19937 gen(7);
  for (int i = 0; i < (1 << 20) + 13; ++i) x.push_back(f32_of(static_cast<uint32_t>(gen())));
  for (int64_t n : {int64_t{1}, int64_t{31}, int64_t{1000}, static_cast<int64_t>(x.size())}) {
    std::vector<bf16> y(n);
    to_bf16(y.data(), x.data(), n);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i)
      if (y[i].bits != f32_to_bf16(x[i]).bits && ++bad <= 5)
        ADD_FAILURE() << "x bits " << std::hex << f32_bits(x[i]) << ": got " << y[i].bits
                      << ", want " << f32_to_bf16(x[i]).bits;
    EXPECT_EQ(bad, 0) << "n=" << n;
  }
}

// ---- linear -------------------------------------------------------------------------------

// The reference works in double from the bf16-rounded operands, so it sees exactly the
// products the kernel sees: a bf16 x bf16 product has <= 16 significant bits and is exact
// in f32, and the only error left is the f32 accumulation. Each of the K additions errs by
// at most 2^-24 times a partial sum bounded by S = sum_k |a_k b_k|; rounding errors of random
// sign grow like sqrt(K) (Higham & Mary, "A new approach to probabilistic rounding error
// analysis", 2019), so the tolerance is sqrt(K) * 2^-24 * S per element, plus 2^-24 of the
// result for a final f32 add (bias, or dw's previous value).
struct Dot {
  double value = 0, abs_sum = 0;
};

double tolerance(const Dot& d, int64_t K) {
  return std::sqrt(static_cast<double>(K)) * kU32 * d.abs_sum + kU32 * std::fabs(d.value);
}

void expect_within(const float* got, const std::vector<Dot>& want, int64_t K, double extra_rel,
                   const char* what) {
  int64_t bad = 0;
  double worst = 0;  // the largest err / tol seen, to see how much room the bound leaves
  for (size_t i = 0; i < want.size(); ++i) {
    const double base = tolerance(want[i], K);
    const double tol = base + extra_rel * (std::fabs(want[i].value) + base);
    const double err = std::fabs(static_cast<double>(got[i]) - want[i].value);
    worst = std::max(worst, err / tol);
    if (!(err <= tol) && ++bad <= 5)
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i].value
                    << " (err " << err << ", tol " << tol << ")";
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << want.size() << " out of tolerance";
  testing::Test::RecordProperty(std::string(what) + "_worst_err_over_tol", std::to_string(worst));
}

// y = x w^T + b from doubles (x [n,in], w [out,in]).
std::vector<Dot> ref_forward(const std::vector<double>& x, const std::vector<double>& w,
                             const std::vector<float>& b, int64_t n, int64_t in, int64_t out) {
  std::vector<Dot> y(n * out);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < out; ++o) {
      Dot d;
      for (int64_t k = 0; k < in; ++k) {
        d.value += x[i * in + k] * w[o * in + k];
        d.abs_sum += std::fabs(x[i * in + k] * w[o * in + k]);
      }
      if (!b.empty()) d.value += b[o];
      y[i * out + o] = d;
    }
  return y;
}

struct Shape {
  int64_t n, in, out;
};
// Odd sizes (no multiple of any blocking), and the Model M MLP projection's K = 3072.
const Shape kShapes[] = {{67, 300, 45}, {1, 7, 3}, {48, 3072, 96}};

TEST(MixedLinear, ForwardMatchesReferenceOnRoundedInputs) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(testing::Message() << "n=" << s.n << " in=" << s.in << " out=" << s.out);
    const auto x = rounded(randn(s.n * s.in, 1)), w = rounded(randn(s.out * s.in, 2));
    const auto b = randn(s.out, 3);
    const auto ref = ref_forward(widened(x), widened(w), b, s.n, s.in, s.out);
    std::vector<float> y(s.n * s.out, 99.0f);
    linear_forward_mixed(y.data(), x.data(), w.data(), b.data(), s.n, s.in, s.out);
    expect_within(y.data(), ref, s.in, 0, "y");

    const auto ref_nb = ref_forward(widened(x), widened(w), {}, s.n, s.in, s.out);
    linear_forward_mixed(y.data(), x.data(), w.data(), nullptr, s.n, s.in, s.out);
    expect_within(y.data(), ref_nb, s.in, 0, "y (no bias)");

    // bf16 output: the f32 result rounded once, at most 2^-8 of its magnitude on top
    // (|y32| <= |ref| + tol).
    std::vector<bf16> yh(s.n * s.out);
    linear_forward_mixed(yh.data(), x.data(), w.data(), b.data(), s.n, s.in, s.out);
    std::vector<float> yhf(yh.size());
    to_f32(yhf.data(), yh.data(), static_cast<int64_t>(yh.size()));
    expect_within(yhf.data(), ref, s.in, kU16, "y (bf16)");
  }
}

// The skip connection in the GEMM's epilogue: bitwise the GEMM (bias included) and then the
// add, so the fused forward changes no bit of training (every shape, with and without a bias,
// and an empty reduction); a residual not added, or added twice, differs by O(1).
TEST(MixedLinear, ResidualInTheEpilogueIsTheGemmThenTheAdd) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(testing::Message() << "n=" << s.n << " in=" << s.in << " out=" << s.out);
    const auto x = rounded(randn(s.n * s.in, 4)), w = rounded(randn(s.out * s.in, 5));
    const auto b = randn(s.out, 6), r = randn(s.n * s.out, 7);
    for (const float* bias : {b.data(), static_cast<const float*>(nullptr)}) {
      std::vector<float> want(s.n * s.out), got(s.n * s.out, 99.0f);
      linear_forward_mixed(want.data(), x.data(), w.data(), bias, s.n, s.in, s.out);
      add(want.data(), want.data(), r.data(), s.n * s.out);
      linear_forward_mixed_residual(got.data(), x.data(), w.data(), bias, r.data(), s.n, s.in,
                                    s.out);
      EXPECT_EQ(got, want) << (bias ? "with" : "without") << " a bias";
    }
  }
  const std::vector<float> b = {1.5f, -2.0f}, r = {1, 2, 3, 4};
  std::vector<float> y(4, 99.0f);
  linear_forward_mixed_residual(y.data(), nullptr, nullptr, b.data(), r.data(), 2, 0, 2);
  EXPECT_EQ(y, (std::vector<float>{2.5f, 0.0f, 4.5f, 2.0f}));
  EXPECT_THROW(
      linear_forward_mixed_residual(y.data(), nullptr, nullptr, b.data(), y.data(), 2, 0, 2),
      Error);
}

TEST(MixedLinear, ForwardWithEmptyReductionIsTheBias) {
  const std::vector<float> b = {1.5f, -2.0f, 0.25f};
  std::vector<float> y(6, 99.0f);
  linear_forward_mixed(y.data(), nullptr, nullptr, b.data(), 2, 0, 3);
  EXPECT_EQ(y, (std::vector<float>{1.5f, -2.0f, 0.25f, 1.5f, -2.0f, 0.25f}));
}

struct BackwardRef {
  std::vector<Dot> dx, dw, db;
};

// dx = dy_h w, dw = dw0 + dy_h^T x, db = db0 + sum_rows(dy), dy_h = bf16(dy).
BackwardRef ref_backward(const std::vector<float>& dy, const std::vector<double>& x,
                         const std::vector<double>& w, const std::vector<float>& dw0,
                         const std::vector<float>& db0, int64_t n, int64_t in, int64_t out) {
  const auto dyh = widened(rounded(dy));
  BackwardRef r;
  r.dx.resize(n * in), r.dw.resize(out * in), r.db.resize(out);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < in; ++k)
      for (int64_t o = 0; o < out; ++o) {
        const double p = dyh[i * out + o] * w[o * in + k];
        r.dx[i * in + k].value += p, r.dx[i * in + k].abs_sum += std::fabs(p);
        const double q = dyh[i * out + o] * x[i * in + k];
        r.dw[o * in + k].value += q, r.dw[o * in + k].abs_sum += std::fabs(q);
      }
  for (int64_t j = 0; j < out * in; ++j) r.dw[j].value += dw0[j];
  for (int64_t o = 0; o < out; ++o) {
    r.db[o].value = db0[o];
    for (int64_t i = 0; i < n; ++i) {
      r.db[o].value += dy[i * out + o];
      r.db[o].abs_sum += std::fabs(dy[i * out + o]);
    }
  }
  return r;
}

TEST(MixedLinear, BackwardMatchesReferenceOnRoundedInputs) {
  for (const Shape& s : kShapes) {
    const int64_t n = s.n, in = s.in, out = s.out;
    const auto x = rounded(randn(n * in, 1)), w = rounded(randn(out * in, 2));
    const auto dy = randn(n * out, 4);
    // dw0 and db0 with full f32 mantissas: a dw accumulated through bf16 would be off by
    // ~2^-8 relative, far outside the tolerance.
    const auto dw0 = randn(out * in, 5), db0 = randn(out, 6);
    const auto ref = ref_backward(dy, widened(x), widened(w), dw0, db0, n, in, out);
    // The workspace for one pass, then two smaller ones: of two rows and a bit (row chunks
    // of 2 where n > out; where n <= out column chunks of that many columns), and of five
    // columns and a bit (column chunks of 5, the last one shorter, where n <= out; row
    // chunks where it holds a row).
    for (int64_t ws_elems :
         {linear_backward_mixed_ws_elems(n, out), 2 * out + 5, std::max(5 * n + 2, out)}) {
      SCOPED_TRACE(testing::Message()
                   << "n=" << n << " in=" << in << " out=" << out << " ws_elems=" << ws_elems);
      std::vector<bf16> ws(ws_elems);
      std::vector<float> dx(n * in, 99.0f), dw = dw0, db = db0;
      linear_backward_mixed(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), n, in,
                            out, ws.data(), ws_elems);
      expect_within(dx.data(), ref.dx, out, 0, "dx");
      expect_within(dw.data(), ref.dw, n, 0, "dw");
      expect_within(db.data(), ref.db, n, 0, "db");

      // Each output on its own (the others null) gives the same values.
      std::vector<float> dx2(n * in, -1.0f), dw2 = dw0, db2 = db0;
      linear_backward_mixed(dx2.data(), nullptr, nullptr, dy.data(), x.data(), w.data(), n, in, out,
                            ws.data(), ws_elems);
      linear_backward_mixed(nullptr, dw2.data(), nullptr, dy.data(), x.data(), w.data(), n, in, out,
                            ws.data(), ws_elems);
      linear_backward_mixed(nullptr, nullptr, db2.data(), dy.data(), x.data(), w.data(), n, in, out,
                            nullptr, 0);
      EXPECT_EQ(dx2, dx);
      EXPECT_EQ(dw2, dw);
      expect_within(db2.data(), ref.db, n, 0, "db alone");
    }
  }
}

// The LM head's path under --dtype bf16: the cross-entropy's gradient rounded where it is
// written, over the logits (row stride 2·out in bf16), then the GEMMs straight from it. The
// same column chunks as the f32 dy's, within the same tolerance of the reference (not the
// same bits: oneDNN's blocking follows the leading dimension, 2·out here; tried).
TEST(MixedLinear, BackwardFromABf16GradientOverTheLogits) {
  for (const Shape& s : kShapes) {
    const int64_t n = s.n, in = s.in, out = s.out;
    const auto x = rounded(randn(n * in, 1)), w = rounded(randn(out * in, 2));
    const auto dy = randn(n * out, 4);
    const auto dw0 = randn(out * in, 5);
    const auto ref =
        ref_backward(dy, widened(x), widened(w), dw0, std::vector<float>(out), n, in, out);
    // dy rounded into the first half of each f32 row's bytes, as ce_backward_bf16_in_place
    // leaves it.
    std::vector<float> logits(n * out);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < out; ++j)
        reinterpret_cast<bf16*>(logits.data())[i * 2 * out + j] = f32_to_bf16(dy[i * out + j]);
    const bf16* dyb = reinterpret_cast<const bf16*>(logits.data());
    for (int64_t chunk : {out, std::max<int64_t>(1, out / 3)}) {
      SCOPED_TRACE(testing::Message()
                   << "n=" << n << " in=" << in << " out=" << out << " chunk=" << chunk);
      std::vector<float> dx(n * in, 99.0f), dw = dw0;
      linear_backward_mixed(dx.data(), dw.data(), dyb, 2 * out, x.data(), w.data(), n, in, out,
                            chunk);
      expect_within(dx.data(), ref.dx, out, 0, "dx");
      expect_within(dw.data(), ref.dw, n, 0, "dw");
    }
  }
}

// ce_backward_bf16_in_place writes exactly to_bf16 of the f32 kernels' gradient, whole
// vocabulary and a vocabulary-parallel slice (targets outside it, padding columns), into
// the first half of each row's bytes.
TEST(MixedCrossEntropy, Bf16GradientOverTheLogitsIsTheF32OneRounded) {
  const int64_t n = 9, V = 1000, Vp = 1024;
  const auto logits0 = randn(n * Vp, 21, 4.0f), lse_src = randn(n, 22);
  std::vector<int32_t> targets(n);
  for (int64_t i = 0; i < n; ++i) targets[i] = static_cast<int32_t>((i * 397 + 11) % V);
  std::vector<float> lse(n);
  for (int64_t i = 0; i < n; ++i) lse[i] = 5.0f + lse_src[i];
  // Whole vocabulary.
  std::vector<float> want(n * Vp), got = logits0;
  cross_entropy_backward(want.data(), logits0.data(), lse.data(), targets.data(), 0.37f, n, V, Vp);
  ce_backward_bf16_in_place(got.data(), lse.data(), targets.data(), 0.37f, n, Vp, V, 0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < Vp; ++j)
      ASSERT_EQ(reinterpret_cast<const bf16*>(got.data())[i * 2 * Vp + j].bits,
                f32_to_bf16(want[i * Vp + j]).bits)
          << "row " << i << " column " << j;
  // A vocabulary-parallel slice: columns [v0, v0 + cols) of the vocabulary, real of them.
  const int64_t cols = 512, v0 = 512, real = V - v0;
  std::vector<float> slice(n * cols);
  for (int64_t i = 0; i < n; ++i)
    std::copy(logits0.begin() + i * Vp + v0, logits0.begin() + i * Vp + v0 + cols,
              slice.begin() + i * cols);
  std::vector<float> want_s(n * cols), got_s = slice;
  vocab_parallel_ce_backward(want_s.data(), slice.data(), lse.data(), targets.data(), 0.37f, n,
                             cols, real, v0);
  ce_backward_bf16_in_place(got_s.data(), lse.data(), targets.data(), 0.37f, n, cols, real, v0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < cols; ++j)
      ASSERT_EQ(reinterpret_cast<const bf16*>(got_s.data())[i * 2 * cols + j].bits,
                f32_to_bf16(want_s[i * cols + j]).bits)
          << "slice row " << i << " column " << j;
}

TEST(MixedLinear, BackwardAccumulatesExactly) {
  const int64_t n = 64, in = 96, out = 80;
  const auto x = rounded(randn(n * in, 1)), w = rounded(randn(out * in, 2));
  const auto dy = randn(n * out, 3);
  std::vector<bf16> ws(linear_backward_mixed_ws_elems(n, out));
  std::vector<float> dx1(n * in), dw1(out * in, 0.0f), db1(out, 0.0f);
  linear_backward_mixed(dx1.data(), dw1.data(), db1.data(), dy.data(), x.data(), w.data(), n, in,
                        out, ws.data(), static_cast<int64_t>(ws.size()));
  std::vector<float> dx2(n * in), dw2(out * in, 0.0f), db2(out, 0.0f);
  for (int rep = 0; rep < 2; ++rep)
    linear_backward_mixed(dx2.data(), dw2.data(), db2.data(), dy.data(), x.data(), w.data(), n, in,
                          out, ws.data(), static_cast<int64_t>(ws.size()));
  // From zero, the first call stores p and the second adds p again: p + p = 2p exactly in
  // f32, so twice the call is bit for bit twice the result; dx is overwritten, not summed.
  for (auto& v : dw1) v *= 2.0f;
  for (auto& v : db1) v *= 2.0f;
  EXPECT_EQ(dw2, dw1);
  EXPECT_EQ(db2, db1);
  EXPECT_EQ(dx2, dx1);
}

TEST(MixedLinear, BackwardRejectsAWorkspaceSmallerThanARowAndAColumn) {
  const int64_t n = 4, in = 8, out = 16;
  std::vector<bf16> x(out * in), w(out * in), ws(out - 1);  // sized for both calls
  std::vector<float> dy(n * out), dx(out * in);
  // n <= out: one column (n elements) is enough; n - 1 is not.
  EXPECT_THROW(linear_backward_mixed(dx.data(), nullptr, nullptr, dy.data(), x.data(), w.data(), n,
                                     in, out, ws.data(), n - 1),
               mt::Error);
  EXPECT_NO_THROW(linear_backward_mixed(dx.data(), nullptr, nullptr, dy.data(), x.data(), w.data(),
                                        n, in, out, ws.data(), n));
  // n > out (dy's transpose): columns are not used, one row (out elements) is needed.
  EXPECT_THROW(linear_backward_mixed(dx.data(), nullptr, nullptr, dy.data(), x.data(), w.data(),
                                     out, in, n, ws.data(), n - 1),
               mt::Error);
  EXPECT_THROW(linear_backward_mixed(dx.data(), nullptr, nullptr, dy.data(), x.data(), w.data(), n,
                                     in, out, nullptr, 0),
               mt::Error);
}

// What the steady state allocates, counted at the C library (every malloc, operator new on
// top of it, oneDNN's and OpenMP's): nothing outside oneDNN's execute. oneDNN 2.6's
// dnnl_primitive_execute builds a std::unordered_map of the arguments and an execution
// context on every call, small blocks freed before it returns (5-6 per matmul here, 2 forward
// matmuls and 2 x 32 backward ones with column chunks of 5); our code around it allocates
// nothing, which this test pins as: AdamW and the conversions allocate 0 blocks, each step
// allocates exactly what its three GEMM calls allocate alone, the same every step, and every
// block is freed before the step ends. The accounting allocator sees nothing after step 1.
TEST(MixedLinear, SteadyStateAllocatesNothingOutsideOneDnnExecute) {
  if (!::mt::test::kAllocCounting) GTEST_SKIP() << "a sanitizer build counts no allocations";
  mem::Tracker tracker;
  mem::ScopedTracker scope(tracker);
  const int64_t n = 96, in = 128, out = 160;
  const auto x = rounded(randn(n * in, 1)), w = rounded(randn(out * in, 2));
  const auto b = randn(out, 3), dy = randn(n * out, 4);
  std::vector<float> y(n * out), dx(n * in), dw(out * in), db(out);
  std::vector<bf16> yh(n * out), ws(3 * out);  // column chunks of 5: 32 per direction
  std::vector<float> master = randn(out * in, 5), m(out * in), v(out * in);
  std::vector<bf16> param(out * in);
  auto fwd32 = [&] { linear_forward_mixed(y.data(), x.data(), w.data(), b.data(), n, in, out); };
  auto fwd16 = [&] { linear_forward_mixed(yh.data(), x.data(), w.data(), b.data(), n, in, out); };
  auto bwd = [&] {
    linear_backward_mixed(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), n, in,
                          out, ws.data(), static_cast<int64_t>(ws.size()));
  };
  auto adamw = [&](int64_t t) {
    adamw_update_mixed(master.data(), param.data(), dw.data(), m.data(), v.data(), out * in, 1e-3f,
                       0.9f, 0.95f, 1e-8f, 0.1f, t);
  };
  auto convert = [&] {
    to_bf16(yh.data(), y.data(), n * out);
    to_f32(y.data(), yh.data(), n * out);
  };
  auto rest = [&](int64_t t) {
    adamw(t);
    convert();
  };
  auto step = [&](int64_t t) {
    fwd32();
    fwd16();
    bwd();
    rest(t);
  };
  step(1);  // builds and caches the oneDNN primitives
  const int64_t tracked = tracker.snapshot().allocations;
  // Each part alone, in the steady state.
  auto count = [](auto&& f) {
    const ::mt::test::AllocMark mark;
    f();
    EXPECT_EQ(mark.live_since(), 0) << "a block outlives the call";
    return mark.allocations_since();
  };
  const int64_t a_fwd32 = count(fwd32), a_fwd16 = count(fwd16), a_bwd = count(bwd);
  EXPECT_EQ(count([&] { adamw(2); }), 0) << "AdamW allocates";
  EXPECT_EQ(count(convert), 0) << "the bf16 conversions allocate";
  EXPECT_GT(a_fwd32, 0) << "the counting hook counts nothing: it is not installed";
  for (int64_t t = 3; t <= 5; ++t) {
    const ::mt::test::AllocMark mark;
    step(t);
    EXPECT_EQ(mark.allocations_since(), a_fwd32 + a_fwd16 + a_bwd) << "step " << t;
    EXPECT_EQ(mark.live_since(), 0) << "step " << t << ": a block outlives the step";
  }
  // oneDNN's per-execute blocks: at most 6 per matmul (5 for 3 arguments, 6 with a bias).
  EXPECT_LE(a_fwd32, 6);
  EXPECT_LE(a_bwd, 6 * 2 * 32);
  EXPECT_EQ(tracker.snapshot().allocations, tracked) << "tracked allocations after step 1";
  std::printf(
      "steady-state step: %lld heap allocations (forward f32 %lld, bf16 %lld, backward %lld)\n",
      static_cast<long long>(a_fwd32 + a_fwd16 + a_bwd), static_cast<long long>(a_fwd32),
      static_cast<long long>(a_fwd16), static_cast<long long>(a_bwd));
}

// ---- AdamW with master weights --------------------------------------------------------------

// ---- the activations stored in bf16 (--dtype bf16: an output that only feeds GEMMs) ----
// Each bf16 overload writes exactly to_bf16 of its f32 overload's output, and the same
// statistics: storing the activation rounded changes no bit of what the GEMM reads. Sizes
// cover a vector body and a tail (c = 37), several threads' rows, and inputs large enough
// (x 40) that GELU's and SiLU's exp saturates, so that every branch of the rounding is taken.
template <class T>
void expect_same_bits(const std::vector<T>& got, const std::vector<T>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(T)), 0) << what;
}

TEST(MixedActivations, NormAndActivationOutputsInBf16AreTheF32OnesRounded) {
  for (auto [n, c] : {std::pair<int64_t, int64_t>{7, 37}, {64, 768}}) {
    SCOPED_TRACE("n=" + std::to_string(n) + " c=" + std::to_string(c));
    const auto x = randn(n * c, 11, 3.0f), w = randn(c, 12), b = randn(c, 13);
    std::vector<float> y(n * c), mean(n), rstd(n), mean_b(n), rstd_b(n);
    std::vector<bf16> yb(n * c);
    for (const float* bias : {b.data(), static_cast<const float*>(nullptr)}) {
      layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), bias, n, c);
      layernorm_forward(yb.data(), mean_b.data(), rstd_b.data(), x.data(), w.data(), bias, n, c);
      expect_same_bits(yb, rounded(y), "layernorm y");
      expect_same_bits(mean_b, mean, "layernorm mean");
      expect_same_bits(rstd_b, rstd, "layernorm rstd");
    }
    rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), n, c, 1e-6f);
    rmsnorm_forward(yb.data(), rstd_b.data(), x.data(), w.data(), n, c, 1e-6f);
    expect_same_bits(yb, rounded(y), "rmsnorm y");
    expect_same_bits(rstd_b, rstd, "rmsnorm rstd");
    const auto big = randn(n * c, 14, 40.0f);
    gelu_forward(y.data(), big.data(), n * c);
    gelu_forward(yb.data(), big.data(), n * c);
    expect_same_bits(yb, rounded(y), "gelu y");
    // SwiGLU: rows of gate | up, c wide each, into c outputs.
    const auto h = randn(n * 2 * c, 15, 40.0f);
    swiglu_forward(y.data(), h.data(), n, c);
    swiglu_forward(yb.data(), h.data(), n, c);
    expect_same_bits(yb, rounded(y), "swiglu y");
  }
}

TEST(MixedAdamW, MasterIsAdamWAndParamIsItsRounding) {
  const int64_t n = 100003;  // threaded, with a vector tail
  auto p = randn(n, 1);
  auto master = p;
  std::vector<float> m1(n, 0.0f), v1(n, 0.0f), m2(n, 0.0f), v2(n, 0.0f);
  std::vector<bf16> param(n);
  for (int64_t t = 1; t <= 4; ++t) {
    const auto g = randn(n, 10 + static_cast<uint32_t>(t), 0.1f);
    adamw_update(p.data(), g.data(), m1.data(), v1.data(), n, 3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
    adamw_update_mixed(master.data(), param.data(), g.data(), m2.data(), v2.data(), n, 3e-3f, 0.9f,
                       0.95f, 1e-8f, 0.1f, t);
    ASSERT_EQ(0, std::memcmp(master.data(), p.data(), n * sizeof(float))) << "master, step " << t;
    ASSERT_EQ(0, std::memcmp(m2.data(), m1.data(), n * sizeof(float))) << "m, step " << t;
    ASSERT_EQ(0, std::memcmp(v2.data(), v1.data(), n * sizeof(float))) << "v, step " << t;
    std::vector<bf16> want(n);
    to_bf16(want.data(), master.data(), n);
    ASSERT_EQ(0, std::memcmp(param.data(), want.data(), n * sizeof(bf16))) << "param, step " << t;
  }
}

TEST(MixedAdamW, RejectsStepZeroAndANullCopy) {
  float p = 0, g = 0, m = 0, v = 0;
  bf16 h;
  EXPECT_THROW(adamw_update_mixed(&p, &h, &g, &m, &v, 1, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 0),
               mt::Error);
  EXPECT_THROW(adamw_update_mixed(&p, nullptr, &g, &m, &v, 1, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 1),
               mt::Error);
}

}  // namespace
}  // namespace mt::kernels

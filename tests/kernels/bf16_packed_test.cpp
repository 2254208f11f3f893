#include "kernels/bf16_packed.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <tuple>
#include <vector>

#include "kernels/bf16_tiles.h"
#include "kernels/kernels.h"
#include "kernels/mixed.h"
#include "kernels/test_util.h"

namespace mt::kernels::packed {
namespace {

using test::randn;
using test::rounded;

// A bf16 value as a double (exact), briefly.
constexpr auto f = test::as_double;

// The problem as the GEMM sees it: op(A)[M, K], op(B)[K, N] stored row-major or transposed
// with padded leading dimensions, C [M, ldc].
struct Problem {
  int64_t M, N, K;
  bool ta, tb;
  std::vector<bf16> A, B;
  int64_t lda, ldb;
  Operand a() const { return {A.data(), ta ? 1 : lda, ta ? lda : 1}; }
  Operand b() const { return {B.data(), tb ? 1 : ldb, tb ? ldb : 1}; }
  double at_a(int64_t i, int64_t k) const { return f(A[ta ? k * lda + i : i * lda + k]); }
  double at_b(int64_t k, int64_t n) const { return f(B[tb ? n * ldb + k : k * ldb + n]); }
};

Problem problem(int64_t M, int64_t N, int64_t K, bool ta, bool tb, uint64_t seed) {
  Problem p{M, N, K, ta, tb, {}, {}, 0, 0};
  p.lda = (ta ? M : K) + (seed % 2 ? 7 : 6);        // even (pairs read in place) or odd (copied)
  p.ldb = (tb ? K : N) + ((seed / 2) % 2 ? 3 : 4);  // likewise
  p.A = rounded(randn((ta ? K : M) * p.lda, seed));
  p.B = rounded(randn((tb ? N : K) * p.ldb, seed + 1));
  return p;
}

// Each C element is a sum of K exact f32 products (bf16 × bf16 fits f32's mantissa) added in
// f32 to a start value s (C's old value, else 0), then bias and residual added: each addition
// rounds by at most 2^-24 of a partial sum, which is at most |s| + Σ|a·b| + |bias| + |r|:
// |C − C_exact| <= (K + 3)·2^-24·(|s| + Σ|a·b| + |bias| + |r|). A bf16 C adds its rounding,
// 2^-8 of |C|. A pair left out, a tail column or row not written, another row's A read or a
// block summed twice moves an element by O(|a·b|), far beyond that bound at these K.
void expect_gemm(const Problem& p, const std::vector<float>& got, int64_t ldc,
                 const std::vector<float>* start, const float* bias, const float* residual,
                 bool c_bf16) {
  for (int64_t i = 0; i < p.M; ++i)
    for (int64_t n = 0; n < p.N; ++n) {
      double want = 0, mag = 0;
      for (int64_t k = 0; k < p.K; ++k) {
        const double t = p.at_a(i, k) * p.at_b(k, n);
        want += t, mag += std::fabs(t);
      }
      for (const double extra :
           {start ? double((*start)[i * ldc + n]) : 0.0, bias ? double(bias[n]) : 0.0,
            residual ? double(residual[i * ldc + n]) : 0.0})
        want += extra, mag += std::fabs(extra);
      double tol = (p.K + 3) * 0x1p-24 * mag;
      if (c_bf16) tol += 0x1p-8 * std::fabs(want);
      ASSERT_NEAR(got[i * ldc + n], want, tol) << "C[" << i << ", " << n << "]";
    }
}

TEST(Bf16Packed, EveryTransposeTailAndBlock) {
  SKIP_WITHOUT_BF16_TILES();
  // M 4k + 1..3 and past a 256-row block; N past a 512-column block and a 64-column panel,
  // not a multiple of 16; K past one 768 block, and the smallest.
  for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{9, 83, 40},
                         {263, 530, 1540},
                         {64, 64, 2},
                         {3, 600, 770}})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        SCOPED_TRACE(testing::Message()
                     << "M=" << M << " N=" << N << " K=" << K << " ta=" << ta << " tb=" << tb);
        const Problem p = problem(M, N, K, ta, tb, uint64_t(M * 7 + N + K + ta * 2 + tb));
        const int64_t ldc = N + 5;
        std::vector<float> C(M * ldc, 99.0f);
        ASSERT_TRUE(gemm(M, N, K, p.a(), p.b(), C.data(), ldc, false, false, nullptr, nullptr));
        expect_gemm(p, C, ldc, nullptr, nullptr, nullptr, false);
        // The padding of C is untouched.
        for (int64_t i = 0; i < M; ++i)
          for (int64_t n = N; n < ldc; ++n) ASSERT_EQ(C[i * ldc + n], 99.0f);
      }
}

TEST(Bf16Packed, AccumulatesAndAddsBiasAndResidual) {
  SKIP_WITHOUT_BF16_TILES();
  const int64_t M = 70, N = 150, K = 1600, ldc = N + 2;
  const Problem p = problem(M, N, K, true, false, 11);
  const std::vector<float> start = randn(M * ldc, 12), bias = randn(N, 13),
                           res = randn(M * ldc, 14);
  std::vector<float> C = start;
  ASSERT_TRUE(gemm(M, N, K, p.a(), p.b(), C.data(), ldc, false, true, bias.data(), res.data()));
  expect_gemm(p, C, ldc, &start, bias.data(), res.data(), false);
}

TEST(Bf16Packed, Bf16OutputInOneBlockOnly) {
  SKIP_WITHOUT_BF16_TILES();
  const int64_t M = 21, N = 97, K = 768, ldc = N + 1;
  const Problem p = problem(M, N, K, false, true, 21);
  const std::vector<float> bias = randn(N, 22);
  std::vector<bf16> Cb(M * ldc);
  ASSERT_TRUE(gemm(M, N, K, p.a(), p.b(), Cb.data(), ldc, true, false, bias.data(), nullptr));
  std::vector<float> C(M * ldc);
  to_f32(C.data(), Cb.data(), M * ldc);
  expect_gemm(p, C, ldc, nullptr, bias.data(), nullptr, true);
  // Refused, for the caller's GEMM: a bf16 C over more than one block of K or accumulated
  // into (its partial sums would be rounded), and an odd K.
  EXPECT_FALSE(gemm(M, N, 1538, p.a(), p.b(), Cb.data(), ldc, true, false, nullptr, nullptr));
  EXPECT_FALSE(gemm(M, N, K, p.a(), p.b(), Cb.data(), ldc, true, true, nullptr, nullptr));
  std::vector<float> Cf(M * ldc);
  EXPECT_FALSE(gemm(M, N, 767, p.a(), p.b(), Cf.data(), ldc, false, false, nullptr, nullptr));
}

// Through the library's bf16 GEMM (gemm_bf16 / the linear layers): the packed kernel and
// oneDNN's agree to the bound above on Model M's shapes, at every transpose the layers use.
TEST(Bf16Packed, AgreesWithOneDnnThroughGemmBf16) {
  SKIP_WITHOUT_BF16_TILES();
  for (auto [ta, tb, M, N, K] : {std::tuple<bool, bool, int64_t, int64_t, int64_t>{
                                     false, true, 256, 768, 768},   // y = x · Wᵀ
                                 {false, false, 256, 768, 3072},    // dx = dy · W
                                 {true, false, 768, 3072, 256}}) {  // dW += dyᵀ · x
    SCOPED_TRACE(testing::Message() << "ta=" << ta << " tb=" << tb << " M=" << M);
    const Problem p = problem(M, N, K, ta, tb, 31);
    std::vector<float> ours(M * N, 0.5f), theirs(M * N, 0.5f);
    setenv("MT_BF16_PACKED", "1", 1);
    gemm_bf16(ta, tb, M, N, K, 1.0f, p.A.data(), p.lda, p.B.data(), p.ldb, 1.0f, ours.data(), N);
    setenv("MT_BF16_PACKED", "0", 1);
    gemm_bf16(ta, tb, M, N, K, 1.0f, p.A.data(), p.lda, p.B.data(), p.ldb, 1.0f, theirs.data(), N);
    unsetenv("MT_BF16_PACKED");
    const std::vector<float> half(M * N, 0.5f);
    expect_gemm(p, ours, N, &half, nullptr, nullptr, false);
    expect_gemm(p, theirs, N, &half, nullptr, nullptr, false);
  }
}

}  // namespace
}  // namespace mt::kernels::packed

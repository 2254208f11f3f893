#include <gtest/gtest.h>

#include <cmath>
#include <tuple>

#include "kernels/kernels.h"
#include "kernels/test_util.h"

namespace mt::kernels {
namespace {

using test::randn;

// Plain double reference of C = alpha op(A) op(B) + beta C.
std::vector<double> ref_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
                             const std::vector<float>& A, int64_t lda, const std::vector<float>& B,
                             int64_t ldb, double beta, const std::vector<float>& C, int64_t ldc,
                             int64_t a_off = 0, int64_t b_off = 0, int64_t c_off = 0) {
  std::vector<double> out(C.begin(), C.end());
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double a = ta ? A[a_off + k * lda + i] : A[a_off + i * lda + k];
        const double b = tb ? B[b_off + j * ldb + k] : B[b_off + k * ldb + j];
        s += a * b;
      }
      double& c = out[c_off + i * ldc + j];
      c = alpha * s + beta * c;
    }
  return out;
}

// f32 with K-term dot products of N(0,1) values: the error of a float sum of K products is
// about sqrt(K) * 2^-24 * sqrt(K) in the worst accumulation order; K <= 300 gives ~2e-5, so
// 1e-4 absolute leaves margin. Entries outside the M x N window (leading-dim padding) must
// stay exactly as they were, and the reference copies them unchanged.
constexpr double kF32Tol = 1e-4;

class GemmShapes : public ::testing::TestWithParam<std::tuple<bool, bool, float>> {};

TEST_P(GemmShapes, MatchesDoubleReference) {
  const auto [ta, tb, beta] = GetParam();
  for (auto [M, N, K] :
       {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {7, 5, 3}, {33, 17, 65}, {64, 130, 300}}) {
    const int64_t pad = 3;  // leading dims wider than the matrices
    const int64_t a_rows = ta ? K : M, a_cols = ta ? M : K;
    const int64_t b_rows = tb ? N : K, b_cols = tb ? K : N;
    const int64_t lda = a_cols + pad, ldb = b_cols + pad + 1, ldc = N + pad + 2;
    auto A = randn(a_rows * lda, 1), B = randn(b_rows * ldb, 2), C = randn(M * ldc, 3);
    const float alpha = 0.75f;
    auto want = ref_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    gemm(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
    test::expect_close(C, want, kF32Tol, 0, "gemm C");
  }
}

INSTANTIATE_TEST_SUITE_P(AllTransposes, GemmShapes,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool(),
                                            ::testing::Values(0.0f, 1.0f)));

TEST(Gemm, BetaZeroIgnoresNaNInC) {
  auto A = randn(4 * 3, 1), B = randn(3 * 5, 2);
  std::vector<float> C(4 * 5, std::nanf(""));
  std::vector<float> zero(4 * 5, 0.0f);
  auto want = ref_gemm(false, false, 4, 5, 3, 1.0, A, 3, B, 5, 0.0, zero, 5);
  gemm(false, false, 4, 5, 3, 1.0f, A.data(), 3, B.data(), 5, 0.0f, C.data(), 5);
  test::expect_close(C, want, kF32Tol, 0, "C");
}

TEST(Gemm, EmptyReductionScalesC) {
  std::vector<float> C = {1, 2, 3, 4};
  gemm(false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.5f, C.data(), 2);
  EXPECT_EQ(C, (std::vector<float>{0.5f, 1, 1.5f, 2}));
}

TEST(Gemm, RejectsTooSmallLeadingDim) {
  std::vector<float> A(16), B(16), C(16);
  EXPECT_THROW(gemm(false, false, 4, 4, 4, 1.0f, A.data(), 3, B.data(), 4, 0.0f, C.data(), 4),
               mt::Error);
}

TEST(Gemm, Bf16MatchesReferenceOnRoundedInputs) {
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.0f, 1.0f}) {
        const int64_t M = 37, N = 29, K = 70;
        const int64_t lda = (ta ? M : K) + 2, ldb = (tb ? K : N) + 1, ldc = N + 3;
        auto Af = randn((ta ? K : M) * lda, 4), Bf = randn((tb ? N : K) * ldb, 5);
        auto C = randn(M * ldc, 6);
        std::vector<bf16> A(Af.size()), B(Bf.size());
        // The reference multiplies the bf16-rounded inputs exactly, so what remains is the
        // f32 accumulation error (~1e-5 for K = 70); inputs themselves are off by up to
        // 2^-9 relative (8-bit mantissa), which is why comparing against the f32 inputs
        // needs a looser bound, checked below.
        for (size_t i = 0; i < A.size(); ++i) A[i] = f32_to_bf16(Af[i]);
        for (size_t i = 0; i < B.size(); ++i) B[i] = f32_to_bf16(Bf[i]);
        std::vector<float> Ar(A.size()), Br(B.size());
        for (size_t i = 0; i < A.size(); ++i) Ar[i] = bf16_to_f32(A[i]);
        for (size_t i = 0; i < B.size(); ++i) Br[i] = bf16_to_f32(B[i]);
        auto want = ref_gemm(ta, tb, M, N, K, 1.0, Ar, lda, Br, ldb, beta, C, ldc);
        auto want_f32 = ref_gemm(ta, tb, M, N, K, 1.0, Af, lda, Bf, ldb, beta, C, ldc);
        gemm_bf16(ta, tb, M, N, K, 1.0f, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
        test::expect_close(C, want, kF32Tol, 0, "bf16 gemm vs rounded inputs");
        // Against the f32 inputs: each product a*b is off by at most (1 + 2^-9)^2 - 1 ~
        // 2^-8 relative (both inputs rounded to an 8-bit mantissa), so the bound per
        // element is 2^-8 * sum_k |a_k b_k|, plus the f32 accumulation tolerance.
        std::vector<float> Aabs(Af.size()), Babs(Bf.size()), zero(C.size(), 0.0f);
        for (size_t i = 0; i < Af.size(); ++i) Aabs[i] = std::fabs(Af[i]);
        for (size_t i = 0; i < Bf.size(); ++i) Babs[i] = std::fabs(Bf[i]);
        auto mag = ref_gemm(ta, tb, M, N, K, 1.0, Aabs, lda, Babs, ldb, 0.0, zero, ldc);
        for (size_t i = 0; i < C.size(); ++i)
          ASSERT_LE(std::fabs(C[i] - want_f32[i]), mag[i] * (1.0 / 256) * 1.01 + kF32Tol) << i;
      }
}

// On a team of 2 a bf16 GEMM of 2^24 multiply-adds or more runs as two one-thread GEMMs on
// column panels (16-aligned), or row panels where C is under 64 columns wide (gemm.cpp
// execute_bf16). Each element is then one f32 sum of exact products (bf16 × bf16 fits f32):
// within (K + 1)·2^-24·Σ|a·b| of the exact value (one rounding per addition, each at most
// 2^-24 of a partial sum; and alpha's). A panel off by a column, one left out or written
// twice, or a row panel reading the other's A misses by O(|a·b|); the leading-dimension
// padding of C must stay as it was.
TEST(Gemm, Bf16OnATeamOfThreadsByPanels) {
  const int saved = threads();
  set_threads(2);
  const int team = threads();  // 1 under OMP_THREAD_LIMIT=1: then the whole GEMMs run
  struct Case {
    int64_t M, N, K;
  };
  for (const Case c : {Case{200, 330, 260}, Case{2000, 40, 220}})  // columns, then rows
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        SCOPED_TRACE(testing::Message()
                     << "M=" << c.M << " N=" << c.N << " ta=" << ta << " tb=" << tb);
        const int64_t lda = (ta ? c.M : c.K) + 2, ldb = (tb ? c.K : c.N) + 1, ldc = c.N + 3;
        const auto Af = randn((ta ? c.K : c.M) * lda, 7), Bf = randn((tb ? c.N : c.K) * ldb, 8);
        std::vector<bf16> A(Af.size()), B(Bf.size());
        std::vector<float> Ar(A.size()), Br(B.size()), Aa(A.size()), Ba(B.size());
        for (size_t i = 0; i < A.size(); ++i)
          A[i] = f32_to_bf16(Af[i]), Ar[i] = bf16_to_f32(A[i]), Aa[i] = std::fabs(Ar[i]);
        for (size_t i = 0; i < B.size(); ++i)
          B[i] = f32_to_bf16(Bf[i]), Br[i] = bf16_to_f32(B[i]), Ba[i] = std::fabs(Br[i]);
        std::vector<float> C(c.M * ldc, 99.0f), zero(C.size(), 0.0f);
        const auto want = ref_gemm(ta, tb, c.M, c.N, c.K, 0.5, Ar, lda, Br, ldb, 0.0, C, ldc);
        const auto mag = ref_gemm(ta, tb, c.M, c.N, c.K, 0.5, Aa, lda, Ba, ldb, 0.0, zero, ldc);
        gemm_bf16(ta, tb, c.M, c.N, c.K, 0.5f, A.data(), lda, B.data(), ldb, 0.0f, C.data(), ldc);
        for (int64_t i = 0; i < c.M; ++i) {
          for (int64_t j = 0; j < c.N; ++j) {
            const int64_t e = i * ldc + j;
            ASSERT_NEAR(C[e], want[e], (c.K + 1) * 0x1p-24 * mag[e])
                << "C[" << i << ", " << j << "]";
          }
          for (int64_t j = c.N; j < ldc; ++j) ASSERT_EQ(C[i * ldc + j], 99.0f) << "padding";
        }
      }
  EXPECT_EQ(threads(), team) << "a panel's one-thread setting leaked to the caller";
  set_threads(saved);
}

TEST(Gemm, BatchedMatchesPerMatrixReference) {
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.0f, 1.0f}) {
        const int64_t M = 9, N = 11, K = 13, batch = 5;
        const int64_t lda = (ta ? M : K) + 2, ldb = (tb ? K : N) + 1, ldc = N + 4;
        const int64_t sa = (ta ? K : M) * lda + 7, sb = (tb ? N : K) * ldb + 3,
                      sc = M * ldc + 5;  // strides with gaps between matrices
        auto A = randn(sa * batch, 7), B = randn(sb * batch, 8), C = randn(sc * batch, 9);
        std::vector<double> want(C.begin(), C.end());
        for (int64_t i = 0; i < batch; ++i) {
          auto w =
              ref_gemm(ta, tb, M, N, K, 0.5, A, lda, B, ldb, beta, C, ldc, i * sa, i * sb, i * sc);
          for (int64_t r = 0; r < M; ++r)
            for (int64_t c = 0; c < N; ++c) want[i * sc + r * ldc + c] = w[i * sc + r * ldc + c];
        }
        gemm_batched(ta, tb, M, N, K, 0.5f, A.data(), lda, sa, B.data(), ldb, sb, beta, C.data(),
                     ldc, sc, batch);
        test::expect_close(C, want, kF32Tol, 0, "batched C");
      }
}

TEST(Gemm, SameBitsTwice) {
  const int64_t M = 200, N = 300, K = 256;
  auto A = randn(M * K, 1), B = randn(K * N, 2);
  std::vector<float> C1(M * N), C2(M * N);
  gemm(false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, C1.data(), N);
  gemm(false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, C2.data(), N);
  EXPECT_EQ(C1, C2);
}

}  // namespace
}  // namespace mt::kernels

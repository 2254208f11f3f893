#include "kernels/bf16_tiles.h"

#include <gtest/gtest.h>

#include <cmath>
#include <tuple>
#include <vector>

#include "kernels/mixed.h"
#include "kernels/test_util.h"

namespace mt::kernels::tiles {
namespace {

using test::randn;
using test::rounded;

// A bf16 value as a double (exact), briefly.
constexpr auto f = test::as_double;

// Each C element is alpha times a sum of K exact f32 products (bf16 × bf16 fits f32's
// mantissa), added in f32: each addition rounds by at most 2^-24 of a partial sum, which is
// at most Σ|a·b|, and alpha's product once more: |C - C_exact| <= |alpha|·(K + 1)·2^-24·Σ|a·b|.
// A pair left out, a tail column or row not written, or another row's A read moves an element
// by O(|a·b|), a hundred times that bound or more at these K.
void expect_product(const std::vector<float>& C, int64_t ldc, int64_t M, int64_t N, int64_t K,
                    float alpha, auto a, auto b) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t n = 0; n < N; ++n) {
      double want = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k)
        want += a(i, k) * b(k, n), mag += std::fabs(a(i, k) * b(k, n));
      const double tol = std::fabs(alpha) * (K + 1) * 0x1p-24 * mag;
      ASSERT_NEAR(C[i * ldc + n], alpha * want, tol) << "C[" << i << ", " << n << "]";
    }
}

TEST(Bf16Tiles, ProductOfPackedRowsWithEveryTail) {
  SKIP_WITHOUT_BF16_TILES();
  // M 4k + 1..3, N past a 64-column panel and not a multiple of 16, K even.
  for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{9, 83, 40},
                         {3, 16, 2},
                         {64, 64, 256},
                         {5, 130, 66}}) {
    SCOPED_TRACE(testing::Message() << "M=" << M << " N=" << N << " K=" << K);
    const int64_t lda = K + 6, ldx = N + 3, ldb = (N + 15) / 16 * 16, ldc = N + 5;
    const auto A = rounded(randn(M * lda, 1)), X = rounded(randn(K * ldx, 2));
    std::vector<bf16> Bv(K * ldb);
    pack_rows(Bv.data(), ldb, X.data(), ldx, K, N);
    std::vector<float> C(M * ldc, 99.0f);
    matmul(M, N, K, 0.75f, A.data(), lda, Bv.data(), ldb, C.data(), ldc);
    expect_product(
        C, ldc, M, N, K, 0.75f, [&](int64_t i, int64_t k) { return f(A[i * lda + k]); },
        [&](int64_t k, int64_t n) { return f(X[k * ldx + n]); });
    for (int64_t i = 0; i < M; ++i)  // columns past N untouched
      for (int64_t n = N; n < ldc; ++n) ASSERT_EQ(C[i * ldc + n], 99.0f);
  }
}

TEST(Bf16Tiles, PackedColumnsAndAnOddReductionPaddedWithZeros) {
  SKIP_WITHOUT_BF16_TILES();
  for (int64_t K : {64, 7}) {  // the word transpose, and the general loop with its zero row
    SCOPED_TRACE(testing::Message() << "K=" << K);
    const int64_t M = 6, N = 37, ldx = K + 2, ldb = 48, Ke = K + K % 2;
    const auto X = rounded(randn(N * ldx, 3));  // B = Xᵀ
    auto a32 = randn(M * Ke, 4);
    for (int64_t i = 0; i < M; ++i)
      if (K % 2) a32[i * Ke + K] = 0.0f;  // A's pad column (its value would meet B's zero row)
    const auto A = rounded(a32);
    std::vector<bf16> Bv(Ke * ldb, bf16{0x7fc0});  // NaN: every element must be written
    pack_cols(Bv.data(), ldb, X.data(), ldx, K, N);
    for (int64_t n = N; n < ldb; ++n) ASSERT_EQ(Bv[2 * n].bits, 0) << "pad column " << n;
    std::vector<float> C(M * N);
    matmul(M, N, Ke, 1.0f, A.data(), Ke, Bv.data(), ldb, C.data(), N);
    expect_product(
        C, N, M, N, K, 1.0f, [&](int64_t i, int64_t k) { return f(A[i * Ke + k]); },
        [&](int64_t k, int64_t n) { return f(X[n * ldx + k]); });
  }
}

// A packed by pack_rows read as its own transpose (matmul_pairs at a_row 2, a_pair 2·ldb):
// attention's dK = dSᵀ·Q and dV = Pᵀ·dO, from an f32 matrix rounded while packed.
TEST(Bf16Tiles, PairStridedReadsAPackedMatrixAsItsTranspose) {
  SKIP_WITHOUT_BF16_TILES();
  const int64_t T = 70, J = 50, ldx = 80, ldv = 64, N = 24, ldb = 32;  // Xᵀ is J × T
  const auto X = randn(T * ldx, 5);                                    // f32 [T, ldx]
  std::vector<bf16> Xv(T * ldv), Yv(T * ldb);
  pack_rows_rounded(Xv.data(), ldv, X.data(), ldx, T, J);
  const auto Y = rounded(randn(T * N, 6));
  pack_rows(Yv.data(), ldb, Y.data(), N, T, N);
  std::vector<float> C(J * N);
  matmul_pairs(J, N, T, 1.0f, Xv.data(), 2, 2 * ldv, Yv.data(), ldb, C.data(), N);
  expect_product(
      C, N, J, N, T, 1.0f,
      [&](int64_t j, int64_t t) { return double(bf16_to_f32(f32_to_bf16(X[t * ldx + j]))); },
      [&](int64_t t, int64_t n) { return f(Y[t * N + n]); });
}

TEST(Bf16Tiles, RefusesAnOddReductionAndANarrowPack) {
  SKIP_WITHOUT_BF16_TILES();
  std::vector<bf16> A(64), B(64);
  std::vector<float> C(16);
  EXPECT_THROW(matmul(2, 4, 3, 1.0f, A.data(), 4, B.data(), 16, C.data(), 4), Error);
  EXPECT_THROW(pack_rows(B.data(), 8, A.data(), 8, 2, 8), Error);
}

}  // namespace
}  // namespace mt::kernels::tiles

#include "kernels/bf16_tiles.h"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "kernels/vec_math.h"

// Only the functions marked so are compiled for AVX-512 (not the file: an inline function
// from a header compiled here for AVX-512 could be the copy the linker keeps for every other
// file too); available() decides at run time whether they may be called.
#define MT_TILE_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16")))

namespace mt::kernels::tiles {
namespace {

constexpr int kRows = 4;     // rows of a C tile
constexpr int kVectors = 4;  // 16-column vectors of a C tile

const uint16_t* bits(const bf16* p) { return reinterpret_cast<const uint16_t*>(p); }

// C[MR rows, NV·16 columns, the last vector's lanes by `last`] = alpha · A · B over K / 2 pairs.
template <int MR, int NV>
MT_TILE_TARGET void tile(int64_t pairs, const uint16_t* A, int64_t a_row, int64_t a_pair,
                         const uint16_t* Bv, int64_t ldb, float* C, int64_t ldc, float alpha,
                         __mmask16 last) {
  // The loops over i and j unrolled in full at any optimisation level, so that acc stays in
  // registers.
  __m512 acc[MR][NV];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t kp = 0; kp < pairs; ++kp) {
    __m512bh b[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) b[j] = (__m512bh)_mm512_loadu_si512(Bv + 2 * (kp * ldb + 16 * j));
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      int32_t a;
      std::memcpy(&a, A + i * a_row + kp * a_pair, 4);
      const __m512bh av = (__m512bh)_mm512_set1_epi32(a);
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], av, b[j]);
    }
  }
  const __m512 s = _mm512_set1_ps(alpha);
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j + 1 < NV; ++j)
      _mm512_storeu_ps(C + i * ldc + 16 * j, _mm512_mul_ps(acc[i][j], s));
    _mm512_mask_storeu_ps(C + i * ldc + 16 * (NV - 1), last, _mm512_mul_ps(acc[i][NV - 1], s));
  }
}

using TileFn = void (*)(int64_t, const uint16_t*, int64_t, int64_t, const uint16_t*, int64_t,
                        float*, int64_t, float, __mmask16);

template <int MR>
constexpr TileFn kByVectors[kVectors] = {tile<MR, 1>, tile<MR, 2>, tile<MR, 3>, tile<MR, 4>};
constexpr const TileFn* kTiles[kRows] = {kByVectors<1>, kByVectors<2>, kByVectors<3>,
                                         kByVectors<4>};

bool cpu_has_them() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512bf16")) return false;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;  // AMX-BF16: CPUID leaf 7, subleaf 0, EDX bit 22
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (edx >> 22 & 1u)) return false;
  return true;
}

template <class Get>
void pack(bf16* Bv, int64_t ldb, int64_t K, int64_t N, Get get) {
  if (ldb < N || ldb % 16 != 0)
    fail("tiles::pack: ldb {} must be a multiple of 16 >= N {}", ldb, N);
  uint16_t* out = reinterpret_cast<uint16_t*>(Bv);
  for (int64_t kp = 0; kp < (K + 1) / 2; ++kp) {
    uint16_t* row = out + 2 * kp * ldb;
    for (int64_t n = 0; n < ldb; ++n) {
      const bool in = n < N;
      row[2 * n] = in ? get(2 * kp, n) : 0;
      row[2 * n + 1] = in && 2 * kp + 1 < K ? get(2 * kp + 1, n) : 0;
    }
  }
}

}  // namespace

bool available() {
  static const bool cpu = cpu_has_them();
  const char* e = std::getenv("MT_BF16_TILES");  // read each time: tests run both schedules
  return cpu && !(e && std::strcmp(e, "0") == 0);
}

bool cpu_supports() { return cpu_has_them(); }

void pack_rows(bf16* Bv, int64_t ldb, const bf16* X, int64_t ldx, int64_t K, int64_t N) {
  const uint16_t* x = bits(X);
  pack(Bv, ldb, K, N, [&](int64_t k, int64_t n) { return x[k * ldx + n]; });
}

void pack_rows_rounded(bf16* Bv, int64_t ldb, const float* X, int64_t ldx, int64_t K, int64_t N) {
  pack(Bv, ldb, K, N, [&](int64_t k, int64_t n) { return detail::bf16_bits(X[k * ldx + n]); });
}

void pack_cols(bf16* Bv, int64_t ldb, const bf16* X, int64_t ldx, int64_t K, int64_t N) {
  if (K % 2 != 0) {  // the general loop, with the zero row
    const uint16_t* x = bits(X);
    return pack(Bv, ldb, K, N, [&](int64_t k, int64_t n) { return x[n * ldx + k]; });
  }
  if (ldb < N || ldb % 16 != 0)
    fail("tiles::pack: ldb {} must be a multiple of 16 >= N {}", ldb, N);
  // B's pair (k, k + 1) of column n is X's row n at k: a transpose of 32-bit words, row by
  // row of X (each read once, in order).
  uint32_t* out = reinterpret_cast<uint32_t*>(Bv);
  const int64_t pairs = K / 2;
  for (int64_t n = 0; n < N; ++n) {
    const uint16_t* row = bits(X) + n * ldx;
    for (int64_t kp = 0; kp < pairs; ++kp) {
      uint32_t w;
      std::memcpy(&w, row + 2 * kp, 4);
      out[kp * ldb + n] = w;
    }
  }
  for (int64_t kp = 0; kp < pairs; ++kp)
    for (int64_t n = N; n < ldb; ++n) out[kp * ldb + n] = 0;
}

void matmul(int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
            const bf16* Bv, int64_t ldb, float* C, int64_t ldc) {
  if (lda % 2 != 0) fail("tiles::matmul: lda {} must be even", lda);
  matmul_pairs(M, N, K, alpha, A, lda, 2, Bv, ldb, C, ldc);
}

void matmul_pairs(int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t a_row,
                  int64_t a_pair, const bf16* Bv, int64_t ldb, float* C, int64_t ldc) {
  if (K % 2 != 0 || N > ldb) fail("tiles::matmul: K {} must be even and N {} <= ldb {}", K, N, ldb);
  constexpr int64_t kCols = 16 * kVectors;
  // Column panels outer: a panel of B (K/2 × 64 pairs, 32 KB at K = 256) stays in L1 while
  // the row tiles pass over it.
  for (int64_t j0 = 0; j0 < N; j0 += kCols) {
    const int64_t cols = std::min(kCols, N - j0);
    const int nv = static_cast<int>((cols + 15) / 16);
    const int tail = static_cast<int>(cols % 16);
    const __mmask16 last = tail == 0 ? __mmask16(0xffff) : __mmask16((1u << tail) - 1);
    for (int64_t i0 = 0; i0 < M; i0 += kRows) {
      const int mr = static_cast<int>(std::min<int64_t>(kRows, M - i0));
      kTiles[mr - 1][nv - 1](K / 2, bits(A) + i0 * a_row, a_row, a_pair, bits(Bv) + 2 * j0, ldb,
                             C + i0 * ldc + j0, ldc, alpha, last);
    }
  }
}

}  // namespace mt::kernels::tiles

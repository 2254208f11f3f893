#include "kernels/bf16_packed.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels/bf16_tiles.h"

// As in bf16_tiles.cpp: only these functions are compiled for AVX-512; tiles::available()
// decides at run time whether they may run.
#define MT_PACKED_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

namespace mt::kernels::packed {
namespace {

constexpr int kRows = 4;           // rows of a C tile
constexpr int kCols = 64;          // columns of a C tile: a B panel's width
constexpr int kVecs = kCols / 16;  // its vectors of 16 f32
static_assert(kCols % 32 == 0 && 16 % kRows == 0);
// Block sizes, chosen by measurement on one Zen 5 core (1 MB L2) over Model M's shapes:
// kKc pairs of B's rows per block (K up to 1,024 in one: dW's token count, the linears'
// inputs; a 64-column panel of it, 128 KB, streams from L2), kNc columns per packed block of
// B (2 MB: a copied A is copied once per block of columns, and A's copy, not B's size, is
// what costs; the panel in use is what must stay close), kMc rows of A per pass over it.
constexpr int64_t kKc = 512;
constexpr int64_t kNc = 1024;
constexpr int64_t kMc = 256;
// Words between copied A micro-panels beyond their kc·4: a multiple of 4 KB apart (kc = 512),
// the copy's stores to consecutive groups all fell in one of L1's 64 sets and evicted each
// other (the copy ran at 5.5 GB/s; 64 more bytes spread them).
constexpr int64_t kGroupPad = 16;

// The calling thread's packing buffers (32-bit words: a bf16 pair each), grown once.
struct Buffers {
  std::vector<uint32_t> b, a;
};
Buffers& buffers() {
  thread_local Buffers b;
  return b;
}

uint16_t bits_at(const Operand& X, int64_t r, int64_t c) {
  uint16_t v;
  std::memcpy(&v, X.p + r * X.row + c * X.col, 2);
  return v;
}

uint32_t pair_word(uint16_t lo, uint16_t hi) { return uint32_t(lo) | uint32_t(hi) << 16; }

// Two rows of 32 bf16 values as 32 pairs (a[i], b[i]): pairs 0-15 in w[0], 16-31 in w[1].
MT_PACKED_TARGET inline void interleave(__m512i a, __m512i b, __m512i* w) {
  const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                      39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  w[0] = _mm512_permutex2var_epi16(a, lo, b);
  w[1] = _mm512_permutex2var_epi16(a, _mm512_add_epi16(lo, _mm512_set1_epi16(16)), b);
}

// r[j] = column j of the 16 × 16 matrix of 32-bit words whose rows were r[0..15].
MT_PACKED_TARGET inline void transpose16(__m512i* r) {
  // The maskz forms, all lanes kept: the plain ones start from an undefined register, which
  // GCC 12 warns of (-Wmaybe-uninitialized) once inlined.
  constexpr __mmask16 kAll = 0xffff;
  constexpr __mmask8 kAll8 = 0xff;
  __m512i a[16], b[16];
  for (int i = 0; i < 8; ++i) {  // pairs of rows' words interleaved, in each 128-bit lane
    a[2 * i] = _mm512_maskz_unpacklo_epi32(kAll, r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_maskz_unpackhi_epi32(kAll, r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // four rows' words: lane l of b[4i + c] is column 4l + c
    b[4 * i] = _mm512_maskz_unpacklo_epi64(kAll8, a[4 * i], a[4 * i + 2]);
    b[4 * i + 1] = _mm512_maskz_unpackhi_epi64(kAll8, a[4 * i], a[4 * i + 2]);
    b[4 * i + 2] = _mm512_maskz_unpacklo_epi64(kAll8, a[4 * i + 1], a[4 * i + 3]);
    b[4 * i + 3] = _mm512_maskz_unpackhi_epi64(kAll8, a[4 * i + 1], a[4 * i + 3]);
  }
  for (int c = 0; c < 4; ++c) {  // the four row groups' lanes gathered per column
    const __m512i t0 = _mm512_maskz_shuffle_i32x4(kAll, b[c], b[4 + c], 0x44);
    const __m512i t1 = _mm512_maskz_shuffle_i32x4(kAll, b[c], b[4 + c], 0xEE);
    const __m512i t2 = _mm512_maskz_shuffle_i32x4(kAll, b[8 + c], b[12 + c], 0x44);
    const __m512i t3 = _mm512_maskz_shuffle_i32x4(kAll, b[8 + c], b[12 + c], 0xEE);
    r[c] = _mm512_maskz_shuffle_i32x4(kAll, t0, t2, 0x88);
    r[c + 4] = _mm512_maskz_shuffle_i32x4(kAll, t0, t2, 0xDD);
    r[c + 8] = _mm512_maskz_shuffle_i32x4(kAll, t1, t3, 0x88);
    r[c + 12] = _mm512_maskz_shuffle_i32x4(kAll, t1, t3, 0xDD);
  }
}

// The bf16 pair (B(2kp, n), B(2kp + 1, n)) of kc pairs from kp0 and columns [n0, n0 + nc)
// into out[q][kp][c] (panel q of 64 columns, zero past nc).
MT_PACKED_TARGET void pack_b(uint32_t* out, const Operand& B, int64_t kp0, int64_t kc, int64_t n0,
                             int64_t nc) {
  const int64_t panels = (nc + kCols - 1) / kCols;
  if (B.col == 1) {
    // Row-major: rows 2kp and 2kp + 1 interleaved, 32 columns at a time.
    for (int64_t q = 0; q < panels; ++q)
      for (int64_t kp = 0; kp < kc; ++kp) {
        const bf16* r0 = B.p + (2 * (kp0 + kp)) * B.row + n0 + q * kCols;
        const bf16* r1 = r0 + B.row;
        uint32_t* dst = out + (q * kc + kp) * kCols;
        for (int h = 0; h < kCols / 32; ++h) {
          const int64_t c = q * kCols + 32 * h, left = std::clamp<int64_t>(nc - c, 0, 32);
          const __mmask32 m = left >= 32 ? ~__mmask32(0) : (__mmask32(1) << left) - 1;
          const __m512i a = _mm512_maskz_loadu_epi16(m, r0 + 32 * h);
          const __m512i b = _mm512_maskz_loadu_epi16(m, r1 + 32 * h);
          __m512i w[2];
          interleave(a, b, w);
          _mm512_storeu_si512(dst + 32 * h, w[0]);
          _mm512_storeu_si512(dst + 32 * h + 16, w[1]);
        }
      }
    return;
  }
  if (B.row == 1 && B.col % 2 == 0) {
    // Column n's pairs are consecutive words (B = Xᵀ of a row-major X, even row stride):
    // 16 columns × 16 pairs transposed in registers at a time.
    for (int64_t q = 0; q < panels; ++q)
      for (int v = 0; v < kCols / 16; ++v) {
        const int64_t c0 = q * kCols + 16 * v;
        const int64_t ncols = std::clamp<int64_t>(nc - c0, 0, 16);
        uint32_t* dst = out + q * kc * kCols + 16 * v;
        for (int64_t kp = 0; kp < kc; kp += 16) {
          const int64_t nk = std::min<int64_t>(16, kc - kp);
          const __mmask16 km = nk >= 16 ? __mmask16(0xffff) : __mmask16((1u << nk) - 1);
          __m512i r[16];
          for (int c = 0; c < 16; ++c)
            r[c] = c < ncols
                       ? _mm512_maskz_loadu_epi32(km, B.p + (n0 + c0 + c) * B.col + 2 * (kp0 + kp))
                       : _mm512_setzero_si512();
          transpose16(r);
          for (int64_t j = 0; j < nk; ++j) _mm512_storeu_si512(dst + (kp + j) * kCols, r[j]);
        }
      }
    return;
  }
  for (int64_t q = 0; q < panels; ++q)
    for (int64_t kp = 0; kp < kc; ++kp)
      for (int64_t c = 0; c < kCols; ++c) {
        const int64_t n = q * kCols + c, k = 2 * (kp0 + kp);
        out[(q * kc + kp) * kCols + c] =
            n < nc ? pair_word(bits_at(B, k, n0 + n), bits_at(B, k + 1, n0 + n)) : 0;
      }
}

// A's rows [i0, i0 + mc), pairs [kp0, kp0 + kc) into 4-row micro-panels, group g's pair kp
// of row r at out[g·group + kp·4 + r] (rows past mc zero).
MT_PACKED_TARGET void pack_a(uint32_t* out, int64_t group, const Operand& A, int64_t i0, int64_t mc,
                             int64_t kp0, int64_t kc) {
  const int64_t groups = (mc + kRows - 1) / kRows;
  if (A.row == 1 && mc % 32 == 0) {
    // Aᵀ row-major (dW = dYᵀ·X): A's rows are consecutive along a stored row; rows 2kp and
    // 2kp + 1 of the stored matrix interleaved, 32 of A's rows at a time, 4 to each group.
    for (int64_t kp = 0; kp < kc; ++kp) {
      const bf16* s0 = A.p + (2 * (kp0 + kp)) * A.col + i0;
      const bf16* s1 = s0 + A.col;
      for (int64_t i = 0; i < mc; i += 32) {
        const __m512i a = _mm512_loadu_si512(s0 + i), b = _mm512_loadu_si512(s1 + i);
        __m512i w[2];
        interleave(a, b, w);
        for (int h = 0; h < 2; ++h) {
          alignas(64) uint32_t words[16];
          _mm512_store_si512(words, w[h]);
          for (int g = 0; g < 16 / kRows; ++g) {
            const int64_t grp = (i + 16 * h + kRows * g) / kRows;
            std::memcpy(out + grp * group + kp * kRows, words + kRows * g, 4 * kRows);
          }
        }
      }
    }
    return;
  }
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t kp = 0; kp < kc; ++kp)
      for (int r = 0; r < kRows; ++r) {
        const int64_t i = g * kRows + r, k = 2 * (kp0 + kp);
        out[g * group + kp * kRows + r] =
            i < mc ? pair_word(bits_at(A, i0 + i, k), bits_at(A, i0 + i, k + 1)) : 0;
      }
}

struct Epilogue {
  bool final = false;               // the last block of K: add bias and residual, store as C's type
  const float* bias = nullptr;      // at the tile's first column
  const float* residual = nullptr;  // at the tile's first element, row stride ldc
  bool c_bf16 = false;
};

// C[MR rows, 64 columns (the first `cols`)] (+)= A · B over `pairs` pairs: A's pair kp of row
// r at a + r·a_row + kp·a_pair (words), B's panel contiguous (64 words per pair).
template <int MR>
MT_PACKED_TARGET void tile(int64_t pairs, const uint32_t* a, int64_t a_row, int64_t a_pair,
                           const uint32_t* b, void* C, int64_t ldc, bool load_c, int64_t cols,
                           const Epilogue& e) {
  __mmask16 mask[kVecs];
  for (int j = 0; j < kVecs; ++j) {
    const int64_t left = std::clamp<int64_t>(cols - 16 * j, 0, 16);
    mask[j] = left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
  }
  float* cf = static_cast<float*>(C);
  // C (and the residual) are added after the products, their lines fetched meanwhile: a tile
  // of a large C is not in cache, and waiting for it before the first product cost 20% of the
  // time on dW's shapes.
  if (load_c)
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
      for (int j = 0; j < kVecs; ++j)
        _mm_prefetch(reinterpret_cast<const char*>(cf + i * ldc + 16 * j), _MM_HINT_T0);
  if (e.final && e.residual)
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
      for (int j = 0; j < kVecs; ++j)
        _mm_prefetch(reinterpret_cast<const char*>(e.residual + i * ldc + 16 * j), _MM_HINT_T0);
  __m512 acc[MR][kVecs];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
    for (int j = 0; j < kVecs; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t kp = 0; kp < pairs; ++kp) {
    __m512bh bv[kVecs];
#pragma GCC unroll 16
    for (int j = 0; j < kVecs; ++j) bv[j] = (__m512bh)_mm512_loadu_si512(b + kp * kCols + 16 * j);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(int32_t(a[i * a_row + kp * a_pair]));
#pragma GCC unroll 16
      for (int j = 0; j < kVecs; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], av, bv[j]);
    }
  }
  if (load_c)
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
      for (int j = 0; j < kVecs; ++j)
        acc[i][j] = _mm512_add_ps(acc[i][j], _mm512_maskz_loadu_ps(mask[j], cf + i * ldc + 16 * j));
  if (e.final && e.bias)
#pragma GCC unroll 16
    for (int j = 0; j < kVecs; ++j) {
      const __m512 bj = _mm512_maskz_loadu_ps(mask[j], e.bias + 16 * j);
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) acc[i][j] = _mm512_add_ps(acc[i][j], bj);
    }
  if (e.final && e.residual)
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
      for (int j = 0; j < kVecs; ++j)
        acc[i][j] =
            _mm512_add_ps(acc[i][j], _mm512_maskz_loadu_ps(mask[j], e.residual + i * ldc + 16 * j));
  if (e.final && e.c_bf16) {
    bf16* cb = static_cast<bf16*>(C);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
      for (int j = 0; j < kVecs; ++j)
        _mm256_mask_storeu_epi16(cb + i * ldc + 16 * j, mask[j],
                                 (__m256i)_mm512_cvtneps_pbh(acc[i][j]));
    return;
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
    for (int j = 0; j < kVecs; ++j)
      _mm512_mask_storeu_ps(cf + i * ldc + 16 * j, mask[j], acc[i][j]);
}

using TileFn = void (*)(int64_t, const uint32_t*, int64_t, int64_t, const uint32_t*, void*, int64_t,
                        bool, int64_t, const Epilogue&);
template <size_t... I>
constexpr std::array<TileFn, sizeof...(I)> tiles_up_to(std::index_sequence<I...>) {
  return {tile<int(I) + 1>...};
}
constexpr auto kTiles = tiles_up_to(std::make_index_sequence<kRows>());

}  // namespace

bool on() {
  const char* e = std::getenv("MT_BF16_PACKED");  // read each time: tests run both GEMMs
  return tiles::available() && !(e && std::strcmp(e, "0") == 0);
}

bool gemm(int64_t M, int64_t N, int64_t K, Operand A, Operand B, void* C, int64_t ldc, bool c_bf16,
          bool accumulate, const float* bias, const float* residual) {
  // Pairs along K; a bf16 C only where no partial sum would be rounded.
  if (!on() || K <= 0 || K % 2 != 0 || (c_bf16 && (accumulate || K > 2 * kKc)) || M <= 0 || N <= 0)
    return false;
  const int64_t pairs = K / 2;
  // A read in place: row-major with pairs as aligned 32-bit words.
  const bool a_direct = A.col == 1 && A.row % 2 == 0 && reinterpret_cast<uintptr_t>(A.p) % 4 == 0;
  Buffers& buf = buffers();
  const int64_t c_elem = c_bf16 ? 2 : 4;
  char* c_bytes = static_cast<char*>(C);
  for (int64_t n0 = 0; n0 < N; n0 += kNc) {
    const int64_t nc = std::min(kNc, N - n0), panels = (nc + kCols - 1) / kCols;
    for (int64_t kp0 = 0; kp0 < pairs; kp0 += kKc) {
      const int64_t kc = std::min(kKc, pairs - kp0);
      const bool last = kp0 + kc == pairs;
      buf.b.resize(std::max<size_t>(buf.b.size(), size_t(panels * kc * kCols)));
      pack_b(buf.b.data(), B, kp0, kc, n0, nc);
      for (int64_t i0 = 0; i0 < M; i0 += kMc) {
        const int64_t mc = std::min(kMc, M - i0);
        const uint32_t* a = nullptr;
        int64_t a_row = 0, a_pair = 0, a_group = 0;  // words
        if (a_direct) {
          a = reinterpret_cast<const uint32_t*>(A.p + i0 * A.row) + kp0;
          a_row = A.row / 2, a_pair = 1, a_group = kRows * a_row;
        } else {
          const int64_t groups = (mc + kRows - 1) / kRows;
          a_row = 1, a_pair = kRows, a_group = kc * kRows + kGroupPad;
          buf.a.resize(std::max<size_t>(buf.a.size(), size_t(groups * a_group)));
          pack_a(buf.a.data(), a_group, A, i0, mc, kp0, kc);
          a = buf.a.data();
        }
        for (int64_t q = 0; q < panels; ++q) {
          const int64_t cols = std::min<int64_t>(kCols, nc - q * kCols), col0 = n0 + q * kCols;
          const uint32_t* bq = buf.b.data() + q * kc * kCols;
          for (int64_t i = 0; i < mc; i += kRows) {
            const int mr = int(std::min<int64_t>(kRows, mc - i));
            const int64_t row = i0 + i;
            Epilogue e;
            e.final = last;
            e.bias = bias ? bias + col0 : nullptr;
            e.residual = residual ? residual + row * ldc + col0 : nullptr;
            e.c_bf16 = c_bf16;
            kTiles[mr - 1](kc, a + (i / kRows) * a_group, a_row, a_pair, bq,
                           c_bytes + (row * ldc + col0) * c_elem, ldc, accumulate || kp0 > 0, cols,
                           e);
          }
        }
      }
    }
  }
  return true;
}

}  // namespace mt::kernels::packed

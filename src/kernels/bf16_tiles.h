// Small bf16 GEMMs written by hand, for the CPU's attention on bf16 operands
// (attention_forward_mixed): per (batch, head) its GEMMs are 64 × 64..T × 64..T, where a
// oneDNN call costs microseconds of setup and reached 245-370 GFLOP/s on one Zen 5 core
// against 490-530 for these tiles (2026-11-29, docs/mixed_precision.md).
//
// The instruction is AVX512-BF16's vdpbf16ps: 16 f32 lanes, each adding the products of a
// pair of bf16 values. So B is stored in pairs along the reduction ("VNNI" order): element
// (k, n) of B[K, N] at Bv[(k / 2) · 2·ldb + 2·n + k % 2], and a row of A supplies its pair
// (k, k + 1) as one 32-bit broadcast. A tile of C is 4 rows × 64 columns: 16 accumulators.
// Each C element is one f32 sum over k in order, so results do not depend on threads.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace mt::kernels::tiles {

// Whether this CPU runs them and they are the better choice: AVX512-BF16 without AMX (where
// oneDNN's AMX kernels are faster), and MT_BF16_TILES is not 0.
bool available();
// The CPU part of that alone.
bool cpu_supports();

// B[K, N] with row k at X + k·ldx packed into Bv (ldb ≥ N, a multiple of 16): pairs of rows
// interleaved; K padded to even and columns N..ldb with zeros. Bv holds ((K + 1) / 2)·2·ldb.
void pack_rows(bf16* Bv, int64_t ldb, const bf16* X, int64_t ldx, int64_t K, int64_t N);
// The same from f32 rows, each value rounded to bf16 (to nearest even, as to_bf16).
void pack_rows_rounded(bf16* Bv, int64_t ldb, const float* X, int64_t ldx, int64_t K, int64_t N);
// B = Xᵀ: B[k, n] = X[n·ldx + k] (X's rows are B's columns), packed as pack_rows packs.
void pack_cols(bf16* Bv, int64_t ldb, const bf16* X, int64_t ldx, int64_t K, int64_t N);

// C[M, N] (f32, row stride ldc) = alpha · A[M, K] · B[K, N]: A row-major bf16 (row stride lda,
// even, so each row's pairs are 32-bit words), B packed (pack_rows or pack_cols with that N
// and ldb), K even (an odd K: one more column of A and row of B, both zero). C is overwritten.
void matmul(int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
            const bf16* Bv, int64_t ldb, float* C, int64_t ldc);
// The same with A read in pairs at any strides: the pair (k, k + 1) of row i is the 32-bit word
// at A + i·a_row + (k / 2)·a_pair (in bf16 elements; matmul is a_row = lda, a_pair = 2). A
// matrix packed by pack_rows is so its own transpose as an A: Xᵀ[n, k] at a_row = 2,
// a_pair = 2·ldb, with no transposing copy.
void matmul_pairs(int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t a_row,
                  int64_t a_pair, const bf16* Bv, int64_t ldb, float* C, int64_t ldc);

}  // namespace mt::kernels::tiles

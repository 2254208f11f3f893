// One-thread bf16 GEMMs on packed panels, for the linear layers' shapes on CPUs with
// AVX512-BF16 and no AMX (tiles::available()), where they beat oneDNN 2.6's matmul on every
// GEMM of Model M's linears: forward and input gradients 1.13x summed, weight gradients
// 1.06-1.10x, on one Zen 5 core (bench/results/bf16-packed.md, docs/mixed_precision.md
// "Packed panels").
//
// The micro-kernel is bf16_tiles.h's 4 × 64 tile of vdpbf16ps. What makes it fast on large
// problems is the memory layout around it, as BLIS arranges a GEMM: B is copied block by
// block (kKc pairs of rows × kNc columns) into panel-major order, each 64-column panel's
// pairs contiguous, so the panel a tile streams is one contiguous run in L1/L2 rather than
// rows at the full matrix's stride (which alias in L1's sets: the unpacked tiles reached
// 290-395 GFLOP/s on these shapes). A is read in place when its pairs are contiguous
// (row-major, even row stride) and copied into 4-row micro-panels otherwise.
//
// Each element of C is a sum in k order within each block of K, added to what C held (the
// old C, or the blocks before), then the bias and the residual: the same whichever columns
// or rows a thread is given, so results do not depend on how callers split C.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace mt::kernels::packed {

// A matrix operand: element (r, c) at p + r·row + c·col (in elements).
struct Operand {
  const bf16* p = nullptr;
  int64_t row = 0, col = 0;
};

// C[M, N] (row stride ldc) = A[M, K] · B[K, N] (+ C when accumulate) (+ bias[n]) (+ residual
// [M, N] at C's strides), in that order; C in f32, or rounded to bf16 (c_bf16). Returns false,
// doing nothing, for what it does not take (the caller's GEMM runs instead): an odd K, or a
// bf16 C with accumulate or with K beyond one block (its partial sums would be rounded).
// One thread; the packing buffers are the calling thread's, grown once.
bool gemm(int64_t M, int64_t N, int64_t K, Operand A, Operand B, void* C, int64_t ldc, bool c_bf16,
          bool accumulate, const float* bias, const float* residual);

// The CPU has the tiles (tiles::available()) and MT_BF16_PACKED is not 0 (0: oneDNN's GEMMs,
// for measurements and for tests of both).
bool on();

}  // namespace mt::kernels::packed

// The launch shapes of the CUDA kernels: the block size, the grid of a grid-stride loop and
// the row split of the column sums. Plain C++ (no CUDA header), so that the host launches
// (the .cu files, through context.h) and the CPU emulation test of the kernels
// (tests/kernels/cuda_emulated_test.cpp) compute the same grids from the same code.
#pragma once

#include <cstdint>

namespace mt::kernels::cuda::detail {

constexpr int kThreads = 256;  // threads per block of every kernel here (a power of two)

// Blocks for a grid-stride loop over n elements (capped; the loop covers the rest).
inline unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  const int64_t cap = int64_t{1} << 16;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > cap ? cap : blocks));
}

// ---- column sums (reduce.cu): deterministic two-phase reductions over rows ---------------
// A plan that splits n rows into `chunks` chunks of `rows_per_chunk` rows (the last may be
// shorter); it depends only on (n, c), so the summation order, and the bits, are fixed.
struct ColumnChunks {
  int64_t rows_per_chunk = 1, chunks = 0;
};
inline ColumnChunks column_chunks(int64_t n, int64_t c) {
  ColumnChunks p;
  if (n <= 0) return p;
  // About 2^20 threads in phase 1 are plenty; at most 256 chunks keeps the partials small.
  const int64_t cols = c < 1 ? 1 : c;
  int64_t chunks = ((int64_t{1} << 20) + cols - 1) / cols;
  chunks = chunks < 1 ? 1 : (chunks > 256 ? 256 : chunks);
  chunks = chunks > n ? n : chunks;
  p.rows_per_chunk = (n + chunks - 1) / chunks;
  p.chunks = (n + p.rows_per_chunk - 1) / p.rows_per_chunk;
  return p;
}

}  // namespace mt::kernels::cuda::detail

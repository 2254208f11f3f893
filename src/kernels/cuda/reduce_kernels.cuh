// The device code of the deterministic reductions (reduce.cu keeps the host side): column
// partial sums over the column_chunks split (launch.h) and their chunk-ordered sum, and the
// double sum / sum of squares, kSumBlocks blocks then one block.
//
// Two compilers read this header: nvcc (through reduce.cu) and the host C++ compiler under the CPU
// emulation of tests/kernels/cuda_emu/cuda_emu.h (tests/kernels/cuda_emulated_test.cpp), which
// defines MT_CUDA_EMULATION and provides the CUDA names used here before including it; the kernels
// are the same text for both.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/device_util.cuh"

namespace mt::kernels::cuda::detail {
namespace {

// Phase 1: thread j of column block blockIdx.x sums rows [k*R, min(n, (k+1)*R)) of column j
// in order, k = blockIdx.y.
__global__ void column_partials_kernel(float* partials, const float* x, int64_t n, int64_t c,
                                       int64_t rows_per_chunk) {
  const int64_t j = blockIdx.x * int64_t{kThreads} + threadIdx.x;
  if (j >= c) return;
  const int64_t k = blockIdx.y;
  const int64_t r0 = k * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < n ? r0 + rows_per_chunk : n;
  float acc = 0.0f;
  for (int64_t i = r0; i < r1; ++i) acc += x[i * c + j];
  partials[k * c + j] = acc;
}

// Phase 2: out[j] += the chunks' partial sums of column j, in chunk order.
__global__ void add_partials_kernel(float* out, const float* partials, int64_t chunks, int64_t c) {
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < c;
       j += int64_t{gridDim.x} * blockDim.x) {
    float acc = 0.0f;
    for (int64_t k = 0; k < chunks; ++k) acc += partials[k * c + j];
    out[j] += acc;
  }
}

constexpr int kSumBlocks = 256;  // a fixed split of sum / sum_squares (not the GPU's size)

// Phase 1: block b, thread t sums (squares of) elements b*kThreads + t + k*(kSumBlocks *
// kThreads) in double, then the block adds its threads in a fixed tree.
template <bool kSquares>
__global__ void sum_partials_kernel(double* partials, const float* x, int64_t n) {
  __shared__ double shm[kThreads];
  double s = 0.0;
  const int64_t stride = int64_t{kSumBlocks} * kThreads;
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n; i += stride) {
    const double v = x[i];
    s += kSquares ? v * v : v;
  }
  const double total = block_reduce(s, shm, AddOp{});
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// Phase 2: one block adds the kSumBlocks partials in a fixed tree.
__global__ void sum_finish_kernel(double* result, const double* partials) {
  __shared__ double shm[kThreads];
  double s = 0.0;
  for (int i = threadIdx.x; i < kSumBlocks; i += kThreads) s += partials[i];
  const double total = block_reduce(s, shm, AddOp{});
  if (threadIdx.x == 0) *result = total;
}

}  // namespace
}  // namespace mt::kernels::cuda::detail

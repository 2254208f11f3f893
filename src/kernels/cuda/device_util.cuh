// Device-side helpers shared by the kernels: a grid-stride loop, a deterministic block
// reduction and the f32 to bf16 rounding of core/dtype.h.
//
// Two compilers read this header: nvcc (through the .cu files and their *_kernels.cuh) and
// the host C++ compiler under the CPU emulation of tests/kernels/cuda_emu/cuda_emu.h, which
// defines MT_CUDA_EMULATION and the CUDA names used here (threadIdx, __syncthreads,
// __float_as_uint, ...) before including it. The one hook is marked "Emulation hook".
#pragma once

#include <cstdint>

// Emulation hook: the CUDA runtime and the host-side context (cuBLASLt, streams) only under
// nvcc; the device code here needs only the launch shapes (kThreads).
#ifndef MT_CUDA_EMULATION
#include <cuda_runtime.h>

#include "kernels/cuda/context.h"
#endif
#include "kernels/cuda/launch.h"

// for (int64_t i = this thread's first element; i < n; i += every thread of the grid)
#define MT_GRID_STRIDE(i, n)                                                \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); \
       i += int64_t{gridDim.x} * blockDim.x)

namespace mt::kernels::cuda::detail {

struct AddOp {
  template <class T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// The reduction of every thread's v over the block, returned to all threads. A fixed binary
// tree in shared memory, so the same inputs give the same bits. blockDim.x must be kThreads
// and `shm` hold kThreads values; every thread of the block must call it.
template <class T, class Op>
__device__ T block_reduce(T v, T* shm, Op op) {
  shm[threadIdx.x] = v;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (static_cast<int>(threadIdx.x) < s)
      shm[threadIdx.x] = op(shm[threadIdx.x], shm[threadIdx.x + s]);
    __syncthreads();
  }
  const T r = shm[0];
  __syncthreads();  // shm may be reused by the caller right away
  return r;
}

// The bits of core/dtype.h's f32_to_bf16(x): to nearest, ties to even; a NaN keeps its sign
// and payload's top bits and is made quiet; subnormals are kept. Integer arithmetic, so the
// bits are the CPU's for every input (the cvt instruction behind __float2bfloat16_rn
// returns a canonical NaN instead).
__device__ inline uint16_t bf16_bits(float x) {
  const uint32_t u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

__device__ inline float bf16_to_float(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

// y[i] = v, or v rounded to bf16: the one line where a kernel templated on its output type
// (f32, or bf16 bits for an output that only feeds GEMMs) writes it.
__device__ inline void store_out(float* y, int64_t i, float v) { y[i] = v; }
__device__ inline void store_out(uint16_t* y, int64_t i, float v) { y[i] = bf16_bits(v); }

}  // namespace mt::kernels::cuda::detail

// The device code of the vocabulary-parallel kernels (vocab_parallel.cu keeps the host side):
// the max and the sum of exps one block of kThreads per row, the rest grid-stride loops.
//
// Two compilers read this header: nvcc (through vocab_parallel.cu) and the host C++ compiler under
// the CPU emulation of tests/kernels/cuda_emu/cuda_emu.h (tests/kernels/cuda_emulated_test.cpp),
// which defines MT_CUDA_EMULATION and provides the CUDA names used here before including it; the
// kernels are the same text for both.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/device_util.cuh"

namespace mt::kernels::cuda {
namespace {

using namespace detail;

__global__ void vp_max_kernel(float* mx, const float* logits, int64_t cols, int64_t real) {
  __shared__ float shm[kThreads];
  const float* x = logits + blockIdx.x * cols;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < real; j += kThreads) m = fmaxf(m, x[j]);
  m = block_reduce(m, shm, MaxOp{});
  if (threadIdx.x == 0) mx[blockIdx.x] = m;
}

__global__ void vp_sum_exp_kernel(float* sum_exp, float* target_logit, const float* logits,
                                  const float* mx, const int32_t* targets, int64_t cols,
                                  int64_t real, int64_t v0) {
  __shared__ float shm[kThreads];
  const int64_t i = blockIdx.x;
  const float* x = logits + i * cols;
  const float m = mx[i];
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < real; j += kThreads) s += expf(x[j] - m);
  s = block_reduce(s, shm, AddOp{});
  if (threadIdx.x == 0) {
    sum_exp[i] = s;
    const int64_t t = static_cast<int64_t>(targets[i]) - v0;
    target_logit[i] = t >= 0 && t < real ? x[t] : 0.0f;
  }
}

__global__ void vp_lse_kernel(float* lse, float* losses, const float* mx, const float* sums,
                              int64_t n) {
  MT_GRID_STRIDE(i, n) {
    const float l = mx[i] + logf(sums[i]);
    lse[i] = l;
    losses[i] = l - sums[n + i];
  }
}

// Same thread reads and writes each element: dlogits may alias logits.
__global__ void vp_ce_backward_kernel(float* dlogits, const float* logits, const float* lse,
                                      const int32_t* targets, float dloss, int64_t n, int64_t cols,
                                      int64_t real, int64_t v0) {
  MT_GRID_STRIDE(e, n * cols) {
    const int64_t i = e / cols, j = e % cols;
    float d = 0.0f;
    if (j < real) {
      const bool target = static_cast<int64_t>(targets[i]) - v0 == j;
      d = (expf(logits[e] - lse[i]) - (target ? 1.0f : 0.0f)) * dloss;
    }
    dlogits[e] = d;
  }
}

__global__ void vp_embedding_forward_kernel(float* y, const int32_t* tokens, const float* wte,
                                            int64_t n, int64_t C, int64_t v0, int64_t rows) {
  MT_GRID_STRIDE(e, n * C) {
    const int64_t i = e / C, j = e % C;
    const int64_t r = static_cast<int64_t>(tokens[i]) - v0;
    y[e] = r >= 0 && r < rows ? wte[r * C + j] : 0.0f;
  }
}

__global__ void add_position_kernel(float* y, const float* wpe, int64_t first, int64_t n,
                                    int64_t T, int64_t C) {
  MT_GRID_STRIDE(e, n * C) {
    const int64_t i = e / C, j = e % C;
    y[e] += wpe[((first + i) % T) * C + j];
  }
}

// dwpe[t, j] += dy[i, j] over the rows i with (first + i) % T == t, in increasing i (the
// CPU's order), one thread per (t, j).
__global__ void position_backward_rows_kernel(float* dwpe, const float* dy, int64_t first,
                                              int64_t n, int64_t T, int64_t C) {
  MT_GRID_STRIDE(e, T * C) {
    const int64_t t = e / C, j = e % C;
    const int64_t i0 = ((t - first) % T + T) % T;
    float acc = dwpe[e];
    for (int64_t i = i0; i < n; i += T) acc += dy[i * C + j];
    dwpe[e] = acc;
  }
}

}  // namespace
}  // namespace mt::kernels::cuda

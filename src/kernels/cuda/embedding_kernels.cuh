// The device code of the embeddings (embedding.cu keeps the host side, the CUB radix sort
// included): the sort keys of the token backward and the accumulation of each run of equal
// keys (one block per sorted position), the forward gather and the position backward.
//
// Two compilers read this header: nvcc (through embedding.cu) and the host C++ compiler under the
// CPU emulation of tests/kernels/cuda_emu/cuda_emu.h (tests/kernels/cuda_emulated_test.cpp), which
// defines MT_CUDA_EMULATION and provides the CUDA names used here before including it; the kernels
// are the same text for both.
#pragma once

#include <cstdint>

#include "kernels/cuda/launch.h"

namespace mt::kernels::cuda::detail {
namespace {

constexpr uint32_t kSkip = 0xffffffffu;  // the sort key of a position whose token is not ours

// keys[i] = the row of dw that position i adds to (kSkip if none), vals[i] = i.
__global__ void token_keys_kernel(uint32_t* keys, int32_t* vals, const int32_t* tokens, int64_t n,
                                  int64_t v0, int64_t rows) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = static_cast<int64_t>(tokens[i]) - v0;
    keys[i] = r >= 0 && r < rows ? static_cast<uint32_t>(r) : kSkip;
    vals[i] = static_cast<int32_t>(i);
  }
}

// Block s starts at sorted index s; only the first index of each run of equal keys works:
// for its row's columns, dw[row, j] += dy[pos, j] over the run's positions in order.
__global__ void accumulate_sorted_kernel(float* dw, const float* dy, const uint32_t* keys,
                                         const int32_t* pos, int64_t n, int64_t C) {
  const int64_t s = blockIdx.x;
  const uint32_t key = keys[s];
  if (key == kSkip || (s > 0 && keys[s - 1] == key)) return;
  int64_t e = s;
  while (e < n && keys[e] == key) ++e;
  float* w = dw + static_cast<int64_t>(key) * C;
  for (int64_t j = threadIdx.x; j < C; j += kThreads) {
    float acc = w[j];
    for (int64_t k = s; k < e; ++k) acc += dy[static_cast<int64_t>(pos[k]) * C + j];
    w[j] = acc;
  }
}

}  // namespace
}  // namespace mt::kernels::cuda::detail

namespace mt::kernels::cuda {
namespace {

using namespace detail;

__global__ void embedding_forward_kernel(float* y, const int32_t* tokens, const float* wte,
                                         const float* wpe, int64_t T, int64_t C, int64_t total) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e / C, j = e % C;
    const float tok = wte[static_cast<int64_t>(tokens[i]) * C + j];
    // No position table (rotary positions): the token row as is, like the CPU's copy.
    y[e] = wpe ? tok + wpe[(i % T) * C + j] : tok;
  }
}

// dwpe[t, j] += dy[b*T + t, j] for b in order (the CPU's order), one thread per (t, j).
__global__ void position_backward_kernel(float* dwpe, const float* dy, int64_t B, int64_t T,
                                         int64_t C) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < T * C;
       e += int64_t{gridDim.x} * blockDim.x) {
    float acc = dwpe[e];
    for (int64_t b = 0; b < B; ++b) acc += dy[b * T * C + e];
    dwpe[e] = acc;
  }
}

}  // namespace
}  // namespace mt::kernels::cuda

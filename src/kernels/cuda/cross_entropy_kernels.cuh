// The device code of the fused softmax + cross-entropy (cross_entropy.cu keeps the host
// side): forward one block of kThreads per row, backward a grid-stride loop over [n, Vp].
//
// Two compilers read this header: nvcc (through cross_entropy.cu) and the host C++ compiler under
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

__global__ void cross_entropy_forward_kernel(float* losses, float* lse, const float* logits,
                                             const int32_t* targets, int64_t V, int64_t Vp) {
  __shared__ float shm[kThreads];
  const int64_t i = blockIdx.x;
  const float* x = logits + i * Vp;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < V; j += kThreads) mx = fmaxf(mx, x[j]);
  mx = block_reduce(mx, shm, MaxOp{});
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < V; j += kThreads) s += expf(x[j] - mx);
  s = block_reduce(s, shm, AddOp{});
  if (threadIdx.x == 0) {
    const int64_t t = targets[i];
    const bool ok = t >= 0 && t < V;
    const float l = mx + logf(s);
    lse[i] = ok ? l : NAN;
    losses[i] = ok ? l - x[t] : NAN;
  }
}

// Element (i, j): (exp(x - lse) - [j == target]) * dloss for j < V, 0 on padding. Each
// element is read and written by the same thread, so dlogits may alias logits.
__global__ void cross_entropy_backward_kernel(float* dlogits, const float* logits, const float* lse,
                                              const int32_t* targets, float dloss, int64_t n,
                                              int64_t V, int64_t Vp) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n * Vp;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e / Vp, j = e % Vp;
    const int64_t t = targets[i];
    float d = 0.0f;
    if (t < 0 || t >= V)
      d = NAN;
    else if (j < V)
      d = (expf(logits[e] - lse[i]) - (j == t ? 1.0f : 0.0f)) * dloss;
    dlogits[e] = d;
  }
}

}  // namespace
}  // namespace mt::kernels::cuda

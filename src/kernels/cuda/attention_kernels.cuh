// The device code of the plain causal attention (attention.cu keeps the host side: the
// cuBLASLt GEMMs, the launches and the choice of the fused path): the causal softmax over
// the scaled scores and its backward, one block of kThreads per row of [B*NH*T, T].
//
// Two compilers read this header: nvcc (through attention.cu) and the host C++ compiler under the
// CPU emulation of tests/kernels/cuda_emu/cuda_emu.h (tests/kernels/cuda_emulated_test.cpp), which
// defines MT_CUDA_EMULATION and provides the CUDA names used here before including it; the kernels
// are the same text for both.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/device_util.cuh"

namespace mt::kernels::cuda {
namespace {

using namespace detail;

// Row blockIdx.x of the [B*NH*T, T] scores (query t = row % T), already scaled by
// 1/sqrt(hd) in the GEMM: softmax over keys 0..t in place, 0 after.
__global__ void causal_softmax_kernel(float* att, int64_t T) {
  __shared__ float shm[kThreads];
  const int64_t row = blockIdx.x;
  const int64_t t = row % T;
  float* p = att + row * T;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j <= t; j += kThreads) mx = fmaxf(mx, p[j]);
  mx = block_reduce(mx, shm, MaxOp{});
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j <= t; j += kThreads) {
    const float e = expf(p[j] - mx);
    p[j] = e;
    s += e;
  }
  const float inv = 1.0f / block_reduce(s, shm, AddOp{});
  for (int64_t j = threadIdx.x; j < T; j += kThreads) p[j] = j <= t ? p[j] * inv : 0.0f;
}

// Row blockIdx.x of dP (in ds) and P: dS = P * (dP - <P, dP>) * scale over keys 0..t, 0 after.
__global__ void causal_softmax_backward_kernel(float* ds, const float* att, int64_t T, float scale) {
  __shared__ float shm[kThreads];
  const int64_t row = blockIdx.x;
  const int64_t t = row % T;
  float* d = ds + row * T;
  const float* p = att + row * T;
  float dot = 0.0f;
  for (int64_t j = threadIdx.x; j <= t; j += kThreads) dot += p[j] * d[j];
  dot = block_reduce(dot, shm, AddOp{});
  for (int64_t j = threadIdx.x; j < T; j += kThreads) d[j] = j <= t ? p[j] * (d[j] - dot) * scale : 0.0f;
}

}  // namespace
}  // namespace mt::kernels::cuda

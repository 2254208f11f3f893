// The device code of the layer norm (layernorm.cu keeps the host side): forward and dx one
// block of kThreads per row; dw/db partial sums over the column_chunks split (launch.h), grid
// (ceil(c / kThreads), chunks).
//
// Two compilers read this header: nvcc (through layernorm.cu) and the host C++ compiler under the
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

// Row blockIdx.x: mean, then the variance of the centred values (two passes, like the CPU),
// rstd = 1 / sqrt(var + 1e-5), y = (x - mean) * rstd * w (+ b). Y: float, or uint16_t (y
// rounded to bf16 once: an output that only feeds GEMMs).
template <typename Y>
__global__ void layernorm_forward_kernel(Y* y, float* mean, float* rstd, const float* x,
                                         const float* w, const float* b, int64_t c) {
  __shared__ float shm[kThreads];
  const int64_t i = blockIdx.x;
  const float* xi = x + i * c;
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < c; j += kThreads) s += xi[j];
  const float m = block_reduce(s, shm, AddOp{}) / static_cast<float>(c);
  float v = 0.0f;
  for (int64_t j = threadIdx.x; j < c; j += kThreads) v += (xi[j] - m) * (xi[j] - m);
  const float r = 1.0f / sqrtf(block_reduce(v, shm, AddOp{}) / static_cast<float>(c) + 1e-5f);
  Y* yi = y + i * c;
  for (int64_t j = threadIdx.x; j < c; j += kThreads) {
    const float n = (xi[j] - m) * r * w[j];
    store_out(yi, j, b ? n + b[j] : n);
  }
  if (threadIdx.x == 0) {
    mean[i] = m;
    rstd[i] = r;
  }
}

// Row blockIdx.x of dx (accumulated): dx += (dy*w - mean(dy*w) - xhat * mean(dy*w*xhat)) * rstd.
__global__ void layernorm_backward_dx_kernel(float* dx, const float* dy, const float* x,
                                             const float* w, const float* mean, const float* rstd,
                                             int64_t c) {
  __shared__ float shm[kThreads];
  const int64_t i = blockIdx.x;
  const float* xi = x + i * c;
  const float* dyi = dy + i * c;
  const float m = mean[i], r = rstd[i];
  float sg = 0.0f, sgx = 0.0f;
  for (int64_t j = threadIdx.x; j < c; j += kThreads) {
    const float g = dyi[j] * w[j];
    sg += g;
    sgx += g * (xi[j] - m) * r;
  }
  const float mg = block_reduce(sg, shm, AddOp{}) / static_cast<float>(c);
  const float mgx = block_reduce(sgx, shm, AddOp{}) / static_cast<float>(c);
  float* dxi = dx + i * c;
  for (int64_t j = threadIdx.x; j < c; j += kThreads) {
    const float xhat = (xi[j] - m) * r;
    dxi[j] += (dyi[j] * w[j] - mg - xhat * mgx) * r;
  }
}

// Phase 1 of dw/db: column j, rows of chunk blockIdx.y in order.
__global__ void layernorm_backward_partials_kernel(float* pw, float* pb, const float* dy,
                                                   const float* x, const float* mean,
                                                   const float* rstd, int64_t n, int64_t c,
                                                   int64_t rows_per_chunk) {
  const int64_t j = blockIdx.x * int64_t{kThreads} + threadIdx.x;
  if (j >= c) return;
  const int64_t k = blockIdx.y;
  const int64_t r0 = k * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < n ? r0 + rows_per_chunk : n;
  float aw = 0.0f, ab = 0.0f;
  for (int64_t i = r0; i < r1; ++i) {
    const float d = dy[i * c + j];
    aw += d * (x[i * c + j] - mean[i]) * rstd[i];
    ab += d;
  }
  pw[k * c + j] = aw;
  if (pb) pb[k * c + j] = ab;
}

}  // namespace
}  // namespace mt::kernels::cuda

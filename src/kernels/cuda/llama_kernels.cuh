// The device code of the Llama-family parts (llama.cu keeps the host side): RMSNorm (one
// block per row; dw by column_chunks partials), rotary embeddings, the SwiGLU gate and the
// grouped-query kv-head expansion and its transpose (grid-stride loops, one thread per
// output element). Each computes what its CPU twin computes (kernels/rmsnorm.cpp, rope.cpp,
// swiglu.cpp, kv_heads.cpp), in the same order where the CPU's order fixes the bits.
//
// Two compilers read this header: nvcc (through llama.cu) and the host C++ compiler under the
// CPU emulation of tests/kernels/cuda_emu/cuda_emu.h (tests/kernels/cuda_llama_emulated_test.cpp),
// which defines MT_CUDA_EMULATION and provides the CUDA names used here before including it;
// the kernels are the same text for both.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"

namespace mt::kernels::cuda {
namespace {

using namespace detail;

// ---- RMSNorm: y = x · r · w, r = 1 / sqrt(mean(x²) + eps) --------------------------------------

template <typename Y>  // float, or uint16_t: y rounded to bf16 once (a GEMM input)
__global__ void rmsnorm_forward_kernel(Y* y, float* rstd, const float* x, const float* w, int64_t c,
                                       float eps) {
  __shared__ float shm[kThreads];
  const int64_t i = blockIdx.x;
  const float* xi = x + i * c;
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < c; j += kThreads) s += xi[j] * xi[j];
  const float r = 1.0f / sqrtf(block_reduce(s, shm, AddOp{}) / static_cast<float>(c) + eps);
  Y* yi = y + i * c;
  for (int64_t j = threadIdx.x; j < c; j += kThreads) store_out(yi, j, xi[j] * r * w[j]);
  if (threadIdx.x == 0) rstd[i] = r;
}

// Row blockIdx.x of dx (accumulated): with g = dy·w and x̂ = x·r, dx += r·(g − x̂·mean(g·x̂)).
__global__ void rmsnorm_backward_dx_kernel(float* dx, const float* dy, const float* x,
                                           const float* w, const float* rstd, int64_t c) {
  __shared__ float shm[kThreads];
  const int64_t i = blockIdx.x;
  const float* xi = x + i * c;
  const float* dyi = dy + i * c;
  const float r = rstd[i];
  float sgx = 0.0f;
  for (int64_t j = threadIdx.x; j < c; j += kThreads) sgx += dyi[j] * w[j] * xi[j] * r;
  const float mgx = block_reduce(sgx, shm, AddOp{}) / static_cast<float>(c);
  float* dxi = dx + i * c;
  for (int64_t j = threadIdx.x; j < c; j += kThreads)
    dxi[j] += (dyi[j] * w[j] - xi[j] * r * mgx) * r;
}

// Phase 1 of dw: column j, the rows of chunk blockIdx.y in order; add_partials sums them.
__global__ void rmsnorm_backward_partials_kernel(float* pw, const float* dy, const float* x,
                                                 const float* rstd, int64_t n, int64_t c,
                                                 int64_t rows_per_chunk) {
  const int64_t j = blockIdx.x * int64_t{kThreads} + threadIdx.x;
  if (j >= c) return;
  const int64_t k = blockIdx.y;
  const int64_t r0 = k * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < n ? r0 + rows_per_chunk : n;
  float aw = 0.0f;
  for (int64_t i = r0; i < r1; ++i) aw += dy[i * c + j] * x[i * c + j] * rstd[i];
  pw[k * c + j] = aw;
}

// ---- rotary embeddings, Hugging Face's rotate_half ---------------------------------------------

// One thread per pair (b, t, head, i < hd/2): dimensions i and i + hd/2 of the head turn by
// the angle of (t, i); sign −1 is the inverse rotation (backward's). total = B·T·heads·hd/2.
__global__ void rope_kernel(float* x, int64_t T, int64_t row_stride, int64_t col0, int64_t heads,
                            int64_t hd, const float* cos, const float* sin, float sign,
                            int64_t total) {
  const int64_t half = hd / 2;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e % half, h = (e / half) % heads, row = e / (half * heads);
    const int64_t t = row % T;
    float* v = x + row * row_stride + col0 + h * hd;
    const float c = cos[t * half + i], s = sign * sin[t * half + i];
    const float a = v[i], z = v[i + half];
    v[i] = a * c - z * s;
    v[i + half] = z * c + a * s;
  }
}

// ---- SwiGLU: y = silu(gate) · up, rows [gate (f) | up (f)] --------------------------------------

__device__ inline float sigmoidf(float g) { return 1.0f / (1.0f + expf(-g)); }

template <typename Y>  // float, or uint16_t: y rounded to bf16 once (a GEMM input)
__global__ void swiglu_forward_kernel(Y* y, const float* h, int64_t f, int64_t total) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e / f, j = e % f;
    const float g = h[i * 2 * f + j], up = h[i * 2 * f + f + j];
    store_out(y, e, g * sigmoidf(g) * up);
  }
}

// dup = dy · silu(g); dgate = dy · up · σ(g)(1 + g(1 − σ(g))).
__global__ void swiglu_backward_kernel(float* dh, const float* h, const float* dy, int64_t f,
                                       int64_t total) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e / f, j = e % f;
    const float g = h[i * 2 * f + j], up = h[i * 2 * f + f + j], sg = sigmoidf(g);
    dh[i * 2 * f + f + j] = dy[e] * (g * sg);
    dh[i * 2 * f + j] = dy[e] * up * sg * (1.0f + g * (1.0f - sg));
  }
}

// ---- grouped-query attention: kv heads to one per query head and back ---------------------------

// full [n, 3C] from qkv [n, C + 2·Ckv]: q copied, k and v head h from kv head h / g. One
// thread per element of full.
__global__ void expand_kv_heads_kernel(float* full, const float* qkv, int64_t heads,
                                       int64_t kv_heads, int64_t hd, int64_t total) {
  const int64_t C = heads * hd, Ckv = kv_heads * hd, g = heads / kv_heads;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e / (3 * C), k = e % (3 * C);
    const float* src = qkv + i * (C + 2 * Ckv);
    if (k < C) {
      full[e] = src[k];
    } else {
      const int64_t part = k / C, h = (k % C) / hd, d = k % hd;
      full[e] = src[C + (part - 1) * Ckv + (h / g) * hd + d];
    }
  }
}

// dqkv [n, C + 2·Ckv] from dfull [n, 3C]: q copied, each kv head the sum of its g query
// heads' gradients, added in head order from the first (the CPU's order: the same bits).
__global__ void reduce_kv_heads_kernel(float* dqkv, const float* dfull, int64_t heads,
                                       int64_t kv_heads, int64_t hd, int64_t total) {
  const int64_t C = heads * hd, Ckv = kv_heads * hd, g = heads / kv_heads, W = C + 2 * Ckv;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e / W, k = e % W;
    const float* src = dfull + i * 3 * C;
    if (k < C) {
      dqkv[e] = src[k];
    } else {
      const int64_t part = 1 + (k - C) / Ckv, kv = ((k - C) % Ckv) / hd, d = k % hd;
      const float* first = src + part * C + kv * g * hd + d;
      float acc = first[0];
      for (int64_t m = 1; m < g; ++m) acc += first[m * hd];
      dqkv[e] = acc;
    }
  }
}

}  // namespace
}  // namespace mt::kernels::cuda

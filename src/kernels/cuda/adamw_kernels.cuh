// The device code of AdamW (adamw.cu keeps the host side: the bias corrections, the segment
// table and the launches): a grid-stride loop for one tensor, and one launch over a table
// of segments, kElemsPerBlock elements of a segment per block.
//
// Two compilers read this header: nvcc (through adamw.cu) and the host C++ compiler under the CPU
// emulation of tests/kernels/cuda_emu/cuda_emu.h (tests/kernels/cuda_emulated_test.cpp), which
// defines MT_CUDA_EMULATION and provides the CUDA names used here before including it; the kernels
// are the same text for both.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/device_util.cuh"

namespace mt::kernels::cuda {
namespace {

using namespace detail;

constexpr int64_t kElemsPerBlock = 4 * kThreads;  // of a segment, in adamw_update_multi

// One element: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g g; p -= lr (mhat / (sqrt(vhat) + eps)
// + wd p). Returns the new parameter.
__device__ inline float adamw_element(float* param, const float* grad, float* m, float* v,
                                      int64_t i, float lr, float beta1, float beta2, float eps,
                                      float wd, float c1, float c2, float grad_scale = 1.0f) {
  const float g = __fmul_rn(grad[i], grad_scale);  // global-norm clipping; exact at 1
  const float mi = __fadd_rn(__fmul_rn(beta1, m[i]), __fmul_rn(1.0f - beta1, g));
  const float vi = __fadd_rn(__fmul_rn(beta2, v[i]), __fmul_rn(__fmul_rn(1.0f - beta2, g), g));
  m[i] = mi;
  v[i] = vi;
  const float mhat = __fmul_rn(mi, c1), vhat = __fmul_rn(vi, c2);
  const float step = __fadd_rn(__fdiv_rn(mhat, __fadd_rn(sqrtf(vhat), eps)), __fmul_rn(wd, param[i]));
  const float p = __fsub_rn(param[i], __fmul_rn(lr, step));
  param[i] = p;
  return p;
}

__global__ void adamw_kernel(float* param, uint16_t* param_bf16, const float* grad, float* m,
                             float* v, int64_t n, float lr, float beta1, float beta2, float eps,
                             float wd, float c1, float c2) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float p = adamw_element(param, grad, m, v, i, lr, beta1, beta2, eps, wd, c1, c2);
    if (param_bf16) param_bf16[i] = bf16_bits(p);
  }
}

// A segment on the device: its elements and the first block that works on it.
struct DeviceSegment {
  int64_t offset, n, first_block;
  float weight_decay;
  float pad;
  uint16_t* bf16_out;  // the segment's bf16 copy (its element 0), or null
};

__global__ void adamw_multi_kernel(float* param, const float* grad, float* m, float* v,
                                   const DeviceSegment* segs, int64_t n_segs, float lr,
                                   float beta1, float beta2, float eps, float c1, float c2,
                                   float grad_scale) {
  // The segment of this block: the last k with segs[k].first_block <= blockIdx.x (segments
  // with no elements have no blocks, so the last such k has this block).
  const int64_t b = blockIdx.x;
  int64_t lo = 0, hi = n_segs - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (segs[mid].first_block <= b)
      lo = mid;
    else
      hi = mid - 1;
  }
  const DeviceSegment s = segs[lo];
  const int64_t start = (b - s.first_block) * kElemsPerBlock;
  const int64_t end = start + kElemsPerBlock < s.n ? start + kElemsPerBlock : s.n;
  for (int64_t k = start + threadIdx.x; k < end; k += kThreads) {
    const float p = adamw_element(param, grad, m, v, s.offset + k, lr, beta1, beta2, eps,
                                  s.weight_decay, c1, c2, grad_scale);
    if (s.bf16_out) s.bf16_out[k] = bf16_bits(p);
  }
}

// Host side: the blocks a segment of n elements takes in adamw_multi_kernel's grid (the
// table's first_block of the next segment is this one's plus these).
inline int64_t segment_blocks(int64_t n) { return (n + kElemsPerBlock - 1) / kElemsPerBlock; }

}  // namespace
}  // namespace mt::kernels::cuda

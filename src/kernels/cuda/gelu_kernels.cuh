// The device code of GELU (gelu.cu keeps the host side): grid-stride loops.
//
// Two compilers read this header: nvcc (through gelu.cu) and the host C++ compiler under the CPU
// emulation of tests/kernels/cuda_emu/cuda_emu.h (tests/kernels/cuda_emulated_test.cpp), which
// defines MT_CUDA_EMULATION and provides the CUDA names used here before including it; the kernels
// are the same text for both.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"

namespace mt::kernels::cuda {
namespace {

using namespace detail;

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCoef = 0.044715f;

template <typename Y>  // float, or uint16_t: y rounded to bf16 once (a GEMM input)
__global__ void gelu_forward_kernel(Y* y, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = x[i];
    const float u = kSqrt2OverPi * (v + kCoef * v * v * v);
    store_out(y, i, v / (1.0f + expf(-2.0f * u)));
  }
}

__global__ void gelu_backward_kernel(float* dx, const float* x, const float* dy, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = x[i];
    const float u = kSqrt2OverPi * (v + kCoef * v * v * v);
    const float s = 1.0f / (1.0f + expf(-2.0f * u));
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCoef * v * v);
    // d/dx [x s(2u)] = s + x s (1 - s) 2 u'
    dx[i] = dy[i] * (s + v * s * (1.0f - s) * 2.0f * du);
  }
}

}  // namespace
}  // namespace mt::kernels::cuda

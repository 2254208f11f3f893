// The device code of the elementwise kernels (elementwise.cu keeps the host side):
// grid-stride loops.
//
// Two compilers read this header: nvcc (through elementwise.cu) and the host C++ compiler under the
// CPU emulation of tests/kernels/cuda_emu/cuda_emu.h (tests/kernels/cuda_emulated_test.cpp), which
// defines MT_CUDA_EMULATION and provides the CUDA names used here before including it; the kernels
// are the same text for both.
#pragma once

#include <cstdint>

#include "kernels/cuda/device_util.cuh"

namespace mt::kernels::cuda {
namespace {

__global__ void add_kernel(float* y, const float* a, const float* b, int64_t n) {
  MT_GRID_STRIDE(i, n) y[i] = a[i] + b[i];
}
__global__ void accumulate_kernel(float* y, const float* x, int64_t n) {
  MT_GRID_STRIDE(i, n) y[i] += x[i];
}
__global__ void scale_kernel(float* y, float s, int64_t n) { MT_GRID_STRIDE(i, n) y[i] *= s; }
__global__ void add_bias_kernel(float* y, const float* b, int64_t n, int64_t c) {
  MT_GRID_STRIDE(i, n * c) y[i] += b[i % c];
}

}  // namespace
}  // namespace mt::kernels::cuda

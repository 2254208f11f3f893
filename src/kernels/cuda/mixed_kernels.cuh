// The device code of the mixed-precision kernels (mixed.cu keeps the host side and the
// bf16 GEMMs): the bf16 conversions and the bias add with one rounding, grid-stride loops.
//
// Two compilers read this header: nvcc (through mixed.cu) and the host C++ compiler under the CPU
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

__global__ void to_bf16_kernel(uint16_t* y, const float* x, int64_t n) {
  MT_GRID_STRIDE(i, n) y[i] = bf16_bits(x[i]);
}

__global__ void to_f32_kernel(float* y, const uint16_t* x, int64_t n) {
  MT_GRID_STRIDE(i, n) y[i] = bf16_to_float(x[i]);
}

// y[i, j] = bf16(acc[i, j] + b[j]) (b may be null): the f32 result rounded once.
__global__ void bias_round_kernel(uint16_t* y, const float* acc, const float* b, int64_t n,
                                  int64_t c) {
  MT_GRID_STRIDE(e, n * c) y[e] = bf16_bits(b ? acc[e] + b[e % c] : acc[e]);
}

}  // namespace
}  // namespace mt::kernels::cuda

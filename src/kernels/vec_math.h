// Small math helpers that GCC vectorises inside `#pragma omp simd` loops. libm's expf is
// not vectorised without -ffast-math, and the exp of the 50k-wide vocabulary and of
// every attention row would then cost as much as a GEMM.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/dtype.h"

namespace mt::kernels::detail {

// e^x for x in [-87, 88] to about 2 ulp; inputs outside are clamped (so e^-inf -> ~1e-38,
// never a NaN). Range reduction x = n*ln2 + r, |r| <= ln2/2, then a degree-6 Taylor
// polynomial (its truncation error r^7/7! < 1.3e-7 relative, about 1 ulp).
inline float fast_exp(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  // Round x*log2(e) to the nearest integer with the 1.5*2^23 trick (exact for |t| < 2^22).
  const float t = x * 1.44269504088896341f + 12582912.0f;
  const float n = t - 12582912.0f;
  int32_t ti;
  std::memcpy(&ti, &t, 4);
  const int32_t ni = ti - 0x4B400000;  // the integer n, from the low mantissa bits of t
  // Cody-Waite: ln2 split in a part with few mantissa bits and the rest.
  float r = x - n * 0.693145751953125f;
  r = r - n * 1.428606765330187045e-06f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (ni + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

// max(m, x) by value, so that GCC vectorises a `reduction(max : m)` over it. std::max(m, x)
// computes the same `m < x ? x : m` (a NaN x is skipped, a NaN m kept, by both), but through
// references GCC 12 leaves that loop scalar: a 50k vocabulary row's max took twice as long
// as its exp-sum (cross_entropy_forward, 1 thread: 25 ms of 35 for Model M's logits).
inline float max_of(float m, float x) { return x > m ? x : m; }

// The bits of f32_to_bf16(x) (core/dtype.h: to nearest, ties to even, NaN kept and made
// quiet) without a branch, so that loops over it vectorise. Not VCVTNEPS2BF16: that
// instruction flushes subnormals to zero.
inline uint16_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

// y[i] = v, or v rounded to bf16 (bf16_bits): the one line where a kernel templated on its
// output type (f32, or bf16 for an output that only feeds GEMMs) writes it.
inline void store(float* y, int64_t i, float v) { y[i] = v; }
inline void store(bf16* y, int64_t i, float v) { reinterpret_cast<uint16_t*>(y)[i] = bf16_bits(v); }

}  // namespace mt::kernels::detail

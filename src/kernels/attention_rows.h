// The pieces the CPU's T × T attention kernels share (attention.cpp in f32, attention_mixed.cpp
// on bf16 operands): the row block and the softmax rows between the GEMMs.
#pragma once

#include <cstdint>

#include "kernels/vec_math.h"

namespace mt::kernels::detail {

// Rows are processed in blocks of this many: the GEMMs of row block [r0, r1) only touch keys
// [0, r1), which skips most of the masked upper triangle.
constexpr int64_t kAttentionBlock = 64;

// Where head h of batch b lives, for the loops that take one head per task (bh = b·NH + h):
// its q, k and v in a [B, T, 3C] tensor (or their gradients in dqkv), its columns of a
// [B, T, C] tensor (the output or its gradient) and its T × T block of the probabilities or
// scores.
struct HeadLayout {
  int64_t T, C, NH;
  template <class X>
  struct Qkv {
    X *q, *k, *v;
  };
  int64_t hd() const { return C / NH; }
  template <class X>
  Qkv<X> qkv(X* base, int64_t bh) const {
    X* q = base + (bh / NH) * T * 3 * C + (bh % NH) * hd();
    return {q, q + C, q + 2 * C};
  }
  template <class X>
  X* rows(X* base, int64_t bh) const {
    return base + (bh / NH) * T * C + (bh % NH) * hd();
  }
  template <class X>
  X* block(X* base, int64_t bh) const {
    return base + bh * T * T;
  }
};

// Row t of p: softmax of s[0..t] in place, zeros after (up to T).
inline void causal_softmax_row(float* p, int64_t t, int64_t T) {
  float mx = p[0];
#pragma omp simd reduction(max : mx)
  for (int64_t j = 0; j <= t; ++j) mx = max_of(mx, p[j]);
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j <= t; ++j) {
    const float e = fast_exp(p[j] - mx);
    p[j] = e;
    s += e;
  }
  const float inv = 1.0f / s;
#pragma omp simd
  for (int64_t j = 0; j <= t; ++j) p[j] *= inv;
  for (int64_t j = t + 1; j < T; ++j) p[j] = 0.0f;
}

// Row t of the softmax backward: ds = p * (dp - <p, dp>) * scale in place over [0, t],
// zeros over (t, r1).
inline void softmax_backward_row(float* ds, const float* p, int64_t t, int64_t r1, float scale) {
  float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
  for (int64_t j = 0; j <= t; ++j) dot += p[j] * ds[j];
#pragma omp simd
  for (int64_t j = 0; j <= t; ++j) ds[j] = p[j] * (ds[j] - dot) * scale;
  for (int64_t j = t + 1; j < r1; ++j) ds[j] = 0.0f;
}

}  // namespace mt::kernels::detail

// Causal multi-head self-attention: GEMMs over all (batch, head) pairs at once, with the
// softmax rows in between.
//
// Rows are processed in blocks of kBlock: the GEMMs of row block [r0, r1) only touch keys
// [0, r1), which skips most of the masked upper triangle (at T = 256 and kBlock = 64 they
// do 10/16 of the full T x T work).
//
// Two schedules, same arithmetic: by default one (b, h) per OpenMP task with
// single-threaded GEMMs inside (oneDNN does not nest); MT_ATTN=batched makes each block's
// GEMM one batched oneDNN call over all B*NH heads, threaded inside, with the softmax rows
// in a parallel loop. The default measured faster (1 thread, B=4, T=256, NH=12: forward
// 16 vs 21 ms, backward 19 vs 34 ms): oneDNN runs this strided batch as a loop of small
// sgemms anyway.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "kernels/attention_rows.h"
#include "kernels/dispatch.h"
#include "kernels/flash_attention.h"
#include "kernels/gemm_internal.h"
#include "kernels/kernels.h"
#include "kernels/vec_math.h"
#if MESHTRAIN_CUDA
#include "kernels/cuda/flash_attention.h"
#endif

namespace mt::kernels {
namespace {

constexpr int64_t kBlock = detail::kAttentionBlock;
using detail::causal_softmax_row;
using detail::softmax_backward_row;

// The calling rank thread's choice (--attention): the flash-style kernel of its device.
thread_local bool t_fused = false;

bool per_head_schedule() {
  static const bool v = [] {
    const char* e = std::getenv("MT_ATTN");
    return !(e && std::strcmp(e, "batched") == 0);
  }();
  return v;
}

void check_shape(int64_t T, int64_t C, int64_t NH) {
  if (NH < 1 || C % NH != 0) fail("attention: C={} is not divisible by NH={}", C, NH);
  if (T < 1) fail("attention: T must be >= 1, got {}", T);
}

// Strides (b, h, row, col) of the views attention multiplies.
struct Views {
  int64_t T, C, NH, hd, C3;
  // q, k or v rows of qkv (row-major [T, hd] per head).
  detail::StridedView qkv_rows(const float* p) const { return {p, {T * C3, hd, C3, 1}}; }
  // The same, transposed ([hd, T]).
  detail::StridedView qkv_cols(const float* p) const { return {p, {T * C3, hd, 1, C3}}; }
  detail::StridedView att_rows(const float* p) const { return {p, {NH * T * T, T * T, T, 1}}; }
  detail::StridedView att_cols(const float* p) const { return {p, {NH * T * T, T * T, 1, T}}; }
  detail::StridedView out_rows(const float* p) const { return {p, {T * C, hd, C, 1}}; }
};

void forward_per_head(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C,
                      int64_t NH) {
  const int64_t hd = C / NH, C3 = 3 * C;
  const detail::HeadLayout at{T, C, NH};
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < B * NH; ++bh) {
    const auto [q, k, v] = at.qkv(qkv, bh);
    float* p = at.block(att, bh);
    float* o = at.rows(out, bh);
    for (int64_t r0 = 0; r0 < T; r0 += kBlock) {
      const int64_t r1 = std::min(T, r0 + kBlock), rows = r1 - r0;
      gemm(false, true, rows, r1, hd, scale, q + r0 * C3, C3, k, C3, 0.0f, p + r0 * T, T);
      for (int64_t t = r0; t < r1; ++t) causal_softmax_row(p + t * T, t, T);
      gemm(false, false, rows, hd, r1, 1.0f, p + r0 * T, T, v, C3, 0.0f, o + r0 * C, C);
    }
  }
}

void backward_per_head(float* dqkv, float* scratch, const float* dout, const float* qkv,
                       const float* att, int64_t B, int64_t T, int64_t C, int64_t NH) {
  const int64_t hd = C / NH, C3 = 3 * C;
  const detail::HeadLayout at{T, C, NH};
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < B * NH; ++bh) {
    const auto [q, k, v] = at.qkv(qkv, bh);
    const auto [dq, dk, dv] = at.qkv(dqkv, bh);
    const float* p = at.block(att, bh);
    const float* dO = at.rows(dout, bh);
    float* ds = at.block(scratch, bh);
    for (int64_t r0 = 0; r0 < T; r0 += kBlock) {
      const int64_t r1 = std::min(T, r0 + kBlock), rows = r1 - r0;
      gemm(false, true, rows, r1, hd, 1.0f, dO + r0 * C, C, v, C3, 0.0f, ds + r0 * T, T);
      for (int64_t t = r0; t < r1; ++t) softmax_backward_row(ds + t * T, p + t * T, t, r1, scale);
      gemm(false, false, rows, hd, r1, 1.0f, ds + r0 * T, T, k, C3, 0.0f, dq + r0 * C3, C3);
    }
    for (int64_t c0 = 0; c0 < T; c0 += kBlock) {
      const int64_t c1 = std::min(T, c0 + kBlock), cols = c1 - c0;
      gemm(true, false, cols, hd, T - c0, 1.0f, ds + c0 * T + c0, T, q + c0 * C3, C3, 0.0f,
           dk + c0 * C3, C3);
      gemm(true, false, cols, hd, T - c0, 1.0f, p + c0 * T + c0, T, dO + c0 * C, C, 0.0f,
           dv + c0 * C3, C3);
    }
  }
}

}  // namespace

void attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t NH) {
  MT_CUDA_DISPATCH(attention_forward(out, att, qkv, B, T, C, NH));
  check_shape(T, C, NH);
  if (B == 0) return;
  if (t_fused) return flash_attention_forward(out, att, qkv, B, T, C, NH);
  if (per_head_schedule()) return forward_per_head(out, att, qkv, B, T, C, NH);
  const int64_t hd = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const Views vw{T, C, NH, hd, C3};
  const int64_t att_st[4] = {NH * T * T, T * T, T, 1}, out_st[4] = {T * C, hd, C, 1};
  for (int64_t r0 = 0; r0 < T; r0 += kBlock) {
    const int64_t r1 = std::min(T, r0 + kBlock), rows = r1 - r0;
    // S[r0:r1, 0:r1] = scale * Q[r0:r1] K[0:r1]^T
    detail::strided_matmul(B, NH, rows, r1, hd, scale, vw.qkv_rows(qkv + r0 * C3),
                           vw.qkv_cols(qkv + C), 0.0f, att + r0 * T, att_st);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < B * NH * rows; ++i) {
      const int64_t bh = i / rows, t = r0 + i % rows;
      causal_softmax_row(att + (bh * T + t) * T, t, T);
    }
    // out[r0:r1] = P[r0:r1, 0:r1] V[0:r1]
    detail::strided_matmul(B, NH, rows, hd, r1, 1.0f, vw.att_rows(att + r0 * T),
                           vw.qkv_rows(qkv + 2 * C), 0.0f, out + r0 * C, out_st);
  }
}

void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int64_t B, int64_t T, int64_t C, int64_t NH) {
  MT_CUDA_DISPATCH(attention_backward(dqkv, scratch, dout, qkv, att, B, T, C, NH));
  check_shape(T, C, NH);
  if (t_fused)
    fail(
        "attention_backward: the blockwise CPU kernel is on for this thread and its backward "
        "reads the forward's output: call flash_attention_backward");
  if (B == 0) return;
  if (per_head_schedule()) return backward_per_head(dqkv, scratch, dout, qkv, att, B, T, C, NH);
  const int64_t hd = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const Views vw{T, C, NH, hd, C3};
  const int64_t att_st[4] = {NH * T * T, T * T, T, 1}, qkv_st[4] = {T * C3, hd, C3, 1};
  // Row blocks: dP = dO V^T, then dS = P * (dP - rowsum(P * dP)) * scale (the softmax
  // backward, with the forward's scale folded in), then dQ = dS K.
  for (int64_t r0 = 0; r0 < T; r0 += kBlock) {
    const int64_t r1 = std::min(T, r0 + kBlock), rows = r1 - r0;
    detail::strided_matmul(B, NH, rows, r1, hd, 1.0f, vw.out_rows(dout + r0 * C),
                           vw.qkv_cols(qkv + 2 * C), 0.0f, scratch + r0 * T, att_st);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < B * NH * rows; ++i) {
      const int64_t bh = i / rows, t = r0 + i % rows;
      softmax_backward_row(scratch + (bh * T + t) * T, att + (bh * T + t) * T, t, r1, scale);
    }
    detail::strided_matmul(B, NH, rows, hd, r1, 1.0f, vw.att_rows(scratch + r0 * T),
                           vw.qkv_rows(qkv + C), 0.0f, dqkv + r0 * C3, qkv_st);
  }
  // Column blocks: key j only receives from queries t >= j, so dK[c0:c1] = dS[c0:T,
  // c0:c1]^T Q[c0:T] and dV[c0:c1] = P[c0:T, c0:c1]^T dO[c0:T].
  for (int64_t c0 = 0; c0 < T; c0 += kBlock) {
    const int64_t c1 = std::min(T, c0 + kBlock), cols = c1 - c0;
    detail::strided_matmul(B, NH, cols, hd, T - c0, 1.0f, vw.att_cols(scratch + c0 * T + c0),
                           vw.qkv_rows(qkv + c0 * C3), 0.0f, dqkv + C + c0 * C3, qkv_st);
    detail::strided_matmul(B, NH, cols, hd, T - c0, 1.0f, vw.att_cols(att + c0 * T + c0),
                           vw.out_rows(dout + c0 * C), 0.0f, dqkv + 2 * C + c0 * C3, qkv_st);
  }
}

void set_fused_attention(bool on) {
  t_fused = on;
#if MESHTRAIN_CUDA
  cuda::detail::set_flash_attention(on);
#endif
}

bool fused_attention() { return t_fused; }

std::string fused_attention_unsupported(int64_t head_dim, int64_t T) {
#if MESHTRAIN_CUDA
  if (!cuda::detail::flash_attention_supports_head_dim(head_dim))
    return "head dim " + std::to_string(head_dim) + " is not one of the fused kernel's 32, 64, 128";
  if (T > cuda::detail::flash_attention_max_T())
    return "seq " + std::to_string(T) + " exceeds the fused kernel's " +
           std::to_string(cuda::detail::flash_attention_max_T());
  return "";
#else
  (void)head_dim;
  (void)T;
  return "this meshtrain was built without CUDA";
#endif
}

// The blockwise CPU kernel (flash_attention.h) keeps the log-sum-exp of each row and needs
// no scratch beyond its own per-thread blocks (one float: a buffer is never empty).
int64_t attention_stash_elems(int64_t B, int64_t NH, int64_t T) {
  MT_CUDA_DISPATCH(attention_stash_elems(B, NH, T));
  return t_fused ? B * NH * T : B * NH * T * T;
}

int64_t attention_scratch_elems(int64_t B, int64_t NH, int64_t T) {
  MT_CUDA_DISPATCH(attention_scratch_elems(B, NH, T));
  return t_fused ? 1 : B * NH * T * T;
}

}  // namespace mt::kernels

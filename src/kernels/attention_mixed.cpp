// Causal attention with bf16 GEMM operands and f32 accumulation (--dtype bf16 on the CPU's
// T × T kernel; kernels/mixed.h attention_forward_mixed). The arithmetic is attention.cpp's,
// row blocks and all; only the GEMMs' operands are bf16. Two schedules of the same GEMMs,
// one (batch, head) per OpenMP task in both:
//   - tiles (bf16_tiles.h): per head, Kᵀ and V (backward: Vᵀ, K, Q, dO) packed once into
//     AVX512-BF16 pair order, then each GEMM a loop of register tiles, no call overhead;
//     where the CPU has AVX512-BF16 and no AMX;
//   - oneDNN's matmul (gemm_bf16) for each GEMM, elsewhere (AMX hosts, odd head dims, or
//     MT_BF16_TILES=0).
// Both sum each product in f32 over the reduction in order, so each is deterministic; their
// bits differ (oneDNN's blocking of the sums is its own).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "kernels/attention_rows.h"
#include "kernels/bf16_tiles.h"
#include "kernels/kernels.h"
#include "kernels/mixed.h"

namespace mt::kernels {
namespace {

using detail::bf16_bits;
using detail::causal_softmax_row;
using detail::kAttentionBlock;
using detail::softmax_backward_row;
constexpr int64_t kBlock = kAttentionBlock;

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// A head's bf16 working buffers: per thread, grown once (the steady state allocates nothing).
std::vector<uint16_t>& rows_buffer(int which, int64_t n) {
  thread_local std::vector<uint16_t> v[6];
  if (static_cast<int64_t>(v[which].size()) < n) v[which].resize(static_cast<size_t>(n));
  return v[which];
}

bf16* as_bf16(std::vector<uint16_t>& v) { return reinterpret_cast<bf16*>(v.data()); }

// Columns [0, cols) of row x (f32) rounded into y.
void round_row(uint16_t* y, const float* x, int64_t cols) {
#pragma omp simd
  for (int64_t j = 0; j < cols; ++j) y[j] = bf16_bits(x[j]);
}

// ---- oneDNN's GEMMs --------------------------------------------------------------------

// A row block's output [rows, hd] (f32, row stride ld) where the caller's `out` takes it: an
// f32 output is written in place; a bf16 one (a GEMM input) goes through the thread's f32
// block and is rounded once, to_bf16's bits.
struct OutRows {
  float* f = nullptr;  // the f32 output's rows, or null
  bf16* h = nullptr;   // the bf16 output's rows, or null
  int64_t ld = 0;
  float* target(int64_t r0, float* block) const { return f ? f + r0 * ld : block; }
  int64_t target_ld(int64_t hd) const { return f ? ld : hd; }
  void finish(int64_t r0, int64_t rows, int64_t hd, const float* block) const {
    if (f) return;
    for (int64_t r = 0; r < rows; ++r)
      round_row(reinterpret_cast<uint16_t*>(h + (r0 + r) * ld), block + r * hd, hd);
  }
};

template <class Out>
OutRows out_rows(Out* out, int64_t C) {
  if constexpr (std::is_same_v<Out, float>)
    return {out, nullptr, C};
  else
    return {nullptr, out, C};
}

std::vector<float>& block_buffer(int64_t n) {
  thread_local std::vector<float> v;
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v;
}

template <class Out>
void forward_onednn(Out* out, float* att, const bf16* qkv, int64_t B, int64_t T, int64_t C,
                    int64_t NH) {
  const int64_t hd = C / NH, C3 = 3 * C;
  const detail::HeadLayout at{T, C, NH};
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < B * NH; ++bh) {
    const auto [q, k, v] = at.qkv(qkv, bh);
    float* p = at.block(att, bh);
    const OutRows o = out_rows(at.rows(out, bh), C);
    float* ob = block_buffer(kBlock * hd).data();
    std::vector<uint16_t>& pb = rows_buffer(0, kBlock * T);  // a row block of P, row stride r1
    for (int64_t r0 = 0; r0 < T; r0 += kBlock) {
      const int64_t r1 = std::min(T, r0 + kBlock), rows = r1 - r0;
      gemm_bf16(false, true, rows, r1, hd, scale, q + r0 * C3, C3, k, C3, 0.0f, p + r0 * T, T);
      for (int64_t t = r0; t < r1; ++t) {
        causal_softmax_row(p + t * T, t, T);
        round_row(pb.data() + (t - r0) * r1, p + t * T, r1);
      }
      gemm_bf16(false, false, rows, hd, r1, 1.0f, as_bf16(pb), r1, v, C3, 0.0f, o.target(r0, ob),
                o.target_ld(hd));
      o.finish(r0, rows, hd, ob);
    }
  }
}

void backward_onednn(float* dqkv, float* scratch, const bf16* dout, const bf16* qkv,
                     const float* att, int64_t B, int64_t T, int64_t C, int64_t NH) {
  const int64_t hd = C / NH, C3 = 3 * C;
  const detail::HeadLayout at{T, C, NH};
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < B * NH; ++bh) {
    const auto [q, k, v] = at.qkv(qkv, bh);
    const auto [dq, dk, dv] = at.qkv(dqkv, bh);
    const float* p = at.block(att, bh);
    const bf16* dO = at.rows(dout, bh);
    float* ds = at.block(scratch, bh);
    // dS and P rounded, [T, T] with row stride T: the column blocks read them down columns.
    std::vector<uint16_t>& dsb = rows_buffer(0, T * T);
    std::vector<uint16_t>& pb = rows_buffer(1, T * T);
    for (int64_t r0 = 0; r0 < T; r0 += kBlock) {
      const int64_t r1 = std::min(T, r0 + kBlock), rows = r1 - r0;
      gemm_bf16(false, true, rows, r1, hd, 1.0f, dO + r0 * C, C, v, C3, 0.0f, ds + r0 * T, T);
      for (int64_t t = r0; t < r1; ++t) {
        softmax_backward_row(ds + t * T, p + t * T, t, r1, scale);
        round_row(dsb.data() + t * T, ds + t * T, r1);
        round_row(pb.data() + t * T, p + t * T, r1);
      }
      gemm_bf16(false, false, rows, hd, r1, 1.0f, as_bf16(dsb) + r0 * T, T, k, C3, 0.0f,
                dq + r0 * C3, C3);
    }
    // Row t was rounded over [0, r1(t)), its block's end: rows t >= c0 cover [c0, c1).
    for (int64_t c0 = 0; c0 < T; c0 += kBlock) {
      const int64_t c1 = std::min(T, c0 + kBlock), cols = c1 - c0;
      gemm_bf16(true, false, cols, hd, T - c0, 1.0f, as_bf16(dsb) + c0 * T + c0, T, q + c0 * C3, C3,
                0.0f, dk + c0 * C3, C3);
      gemm_bf16(true, false, cols, hd, T - c0, 1.0f, as_bf16(pb) + c0 * T + c0, T, dO + c0 * C, C,
                0.0f, dv + c0 * C3, C3);
    }
  }
}

// ---- the tiles ---------------------------------------------------------------------------
// Packed widths: ldk the keys as B's columns (Kᵀ, Vᵀ), ldh the head dims (V, K, Q, dO), ldp
// an even row of P or dS (a reduction over keys pairs its columns; the pad column is 0).

template <class Out>
void forward_tiles(Out* out, float* att, const bf16* qkv, int64_t B, int64_t T, int64_t C,
                   int64_t NH) {
  const int64_t hd = C / NH, C3 = 3 * C;
  const detail::HeadLayout at{T, C, NH};
  const int64_t ldk = round_up(T, 16), ldh = round_up(hd, 16), ldp = round_up(T, 2);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < B * NH; ++bh) {
    const auto [q, k, v] = at.qkv(qkv, bh);
    float* p = at.block(att, bh);
    const OutRows o = out_rows(at.rows(out, bh), C);
    float* ob = block_buffer(kBlock * hd).data();
    std::vector<uint16_t>& kt = rows_buffer(0, hd * ldk + 2 * ldk);
    std::vector<uint16_t>& vv = rows_buffer(1, ldp * ldh);
    std::vector<uint16_t>& pb = rows_buffer(2, kBlock * ldp);
    tiles::pack_cols(as_bf16(kt), ldk, k, C3, hd, T);  // Kᵀ [hd, T]
    tiles::pack_rows(as_bf16(vv), ldh, v, C3, T, hd);  // V [T, hd]
    for (int64_t r0 = 0; r0 < T; r0 += kBlock) {
      const int64_t r1 = std::min(T, r0 + kBlock), rows = r1 - r0, r1e = round_up(r1, 2);
      tiles::matmul(rows, r1, hd, scale, q + r0 * C3, C3, as_bf16(kt), ldk, p + r0 * T, T);
      for (int64_t t = r0; t < r1; ++t) {
        causal_softmax_row(p + t * T, t, T);
        uint16_t* row = pb.data() + (t - r0) * ldp;
        round_row(row, p + t * T, r1);
        if (r1e != r1) row[r1] = 0;
      }
      tiles::matmul(rows, hd, r1e, 1.0f, as_bf16(pb), ldp, as_bf16(vv), ldh, o.target(r0, ob),
                    o.target_ld(hd));
      o.finish(r0, rows, hd, ob);
    }
  }
}

void backward_tiles(float* dqkv, float* scratch, const bf16* dout, const bf16* qkv,
                    const float* att, int64_t B, int64_t T, int64_t C, int64_t NH) {
  const int64_t hd = C / NH, C3 = 3 * C;
  const detail::HeadLayout at{T, C, NH};
  const int64_t ldk = round_up(T, 16), ldh = round_up(hd, 16), ldp = round_up(T, 2);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < B * NH; ++bh) {
    const auto [q, k, v] = at.qkv(qkv, bh);
    const auto [dq, dk, dv] = at.qkv(dqkv, bh);
    const float* p = at.block(att, bh);
    const bf16* dO = at.rows(dout, bh);
    float* ds = at.block(scratch, bh);
    std::vector<uint16_t>& vt = rows_buffer(0, hd * ldk + 2 * ldk);
    std::vector<uint16_t>& kqo = rows_buffer(1, 3 * ldp * ldh);  // K, Q, dO packed
    std::vector<uint16_t>& dsb = rows_buffer(2, T * ldp);        // dS rounded, by query
    std::vector<uint16_t>& dsv = rows_buffer(3, ldp * ldk);      // dS packed, query pairs
    std::vector<uint16_t>& pv = rows_buffer(4, ldp * ldk);       // P packed, query pairs
    bf16* kv = as_bf16(kqo);
    bf16* qv = kv + ldp * ldh;
    bf16* ov = qv + ldp * ldh;
    tiles::pack_cols(as_bf16(vt), ldk, v, C3, hd, T);  // Vᵀ, for dP = dO·Vᵀ
    tiles::pack_rows(kv, ldh, k, C3, T, hd);           // K, for dQ = dS·K
    tiles::pack_rows(qv, ldh, q, C3, T, hd);           // Q, for dK = dSᵀ·Q
    tiles::pack_rows(ov, ldh, dO, C, T, hd);           // dO, for dV = Pᵀ·dO
    for (int64_t r0 = 0; r0 < T; r0 += kBlock) {
      const int64_t r1 = std::min(T, r0 + kBlock), rows = r1 - r0, r1e = round_up(r1, 2);
      tiles::matmul(rows, r1, hd, 1.0f, dO + r0 * C, C, as_bf16(vt), ldk, ds + r0 * T, T);
      for (int64_t t = r0; t < r1; ++t) {
        softmax_backward_row(ds + t * T, p + t * T, t, r1, scale);
        uint16_t* row = dsb.data() + t * ldp;
        round_row(row, ds + t * T, r1);
        if (r1e != r1) row[r1] = 0;
      }
      tiles::matmul(rows, hd, r1e, 1.0f, as_bf16(dsb) + r0 * ldp, ldp, kv, ldh, dq + r0 * C3, C3);
      // The block's query pairs of dS and P over keys [0, r1) (keys past r1 are 0 in both):
      // read as dSᵀ and Pᵀ by the key blocks below, pairs along queries, with no transpose.
      tiles::pack_rows_rounded(as_bf16(dsv) + r0 * ldk, ldk, ds + r0 * T, T, rows, r1);
      tiles::pack_rows_rounded(as_bf16(pv) + r0 * ldk, ldk, p + r0 * T, T, rows, r1);
    }
    // Key block [c0, c1) receives from queries t >= c0: dK = dSᵀ·Q and dV = Pᵀ·dO over them.
    for (int64_t c0 = 0; c0 < T; c0 += kBlock) {
      const int64_t cols = std::min(T, c0 + kBlock) - c0, at = c0 * ldk + 2 * c0;
      tiles::matmul_pairs(cols, hd, ldp - c0, 1.0f, as_bf16(dsv) + at, 2, 2 * ldk, qv + c0 * ldh,
                          ldh, dk + c0 * C3, C3);
      tiles::matmul_pairs(cols, hd, ldp - c0, 1.0f, as_bf16(pv) + at, 2, 2 * ldk, ov + c0 * ldh,
                          ldh, dv + c0 * C3, C3);
    }
  }
}

void check_shape(const char* what, int64_t T, int64_t C, int64_t NH) {
  if (device::on_cuda()) fail("{}: the CPU's kernel (a GPU runs its own)", what);
  if (NH < 1 || C % NH != 0) fail("{}: C={} is not divisible by NH={}", what, C, NH);
  if (T < 1) fail("{}: T must be >= 1, got {}", what, T);
}

bool use_tiles(int64_t C, int64_t NH) { return tiles::available() && (C / NH) % 2 == 0; }

template <class Out>
void forward_mixed(Out* out, float* att, const bf16* qkv, int64_t B, int64_t T, int64_t C,
                   int64_t NH) {
  check_shape("attention_forward_mixed", T, C, NH);
  if (B == 0) return;
  if (use_tiles(C, NH)) return forward_tiles(out, att, qkv, B, T, C, NH);
  forward_onednn(out, att, qkv, B, T, C, NH);
}

}  // namespace

void attention_forward_mixed(float* out, float* att, const bf16* qkv, int64_t B, int64_t T,
                             int64_t C, int64_t NH) {
  forward_mixed(out, att, qkv, B, T, C, NH);
}

void attention_forward_mixed(bf16* out, float* att, const bf16* qkv, int64_t B, int64_t T,
                             int64_t C, int64_t NH) {
  forward_mixed(out, att, qkv, B, T, C, NH);
}

void attention_backward_mixed(float* dqkv, float* scratch, const bf16* dout, const bf16* qkv,
                              const float* att, int64_t B, int64_t T, int64_t C, int64_t NH) {
  check_shape("attention_backward_mixed", T, C, NH);
  if (B == 0) return;
  if (use_tiles(C, NH)) return backward_tiles(dqkv, scratch, dout, qkv, att, B, T, C, NH);
  backward_onednn(dqkv, scratch, dout, qkv, att, B, T, C, NH);
}

}  // namespace mt::kernels

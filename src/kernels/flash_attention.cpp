// Blockwise attention with an online softmax on the CPU (flash-attention 2's loop order,
// Dao 2023, algorithms 1 and 2), f32. See flash_attention.h.
//
// Forward: one OpenMP task per (b, h, query block of kFlashQueryBlock rows). The task walks
// the key blocks its rows can see (causal: up to its last row's position), each block one
// GEMM S = scale·Q·Kᵀ, then per row the running max m and sum l are updated, the running
// output rescaled by exp(m_old − m_new) and P·V added by a second GEMM. At the end
// o = acc / l and lse = m + log l.
//
// Backward: one task per (b, key/value head), its query heads in order, key blocks outermost (a key
// block's dK and dV are summed in the task's small buffers, then added to the output once): for
// every query block that sees the key block, P = exp(scale·Q·Kᵀ − lse) again, dV += Pᵀ·dO, dP =
// dO·Vᵀ, dS = P ∘ (dP − D)·scale with D = rowsum(dO ∘ O), dQ += dS·K, dK += dSᵀ·Q. Five GEMMs per
// block pair, as in the naive kernel's backward, but on blocks.
//
// Every sum runs in a fixed order that does not depend on the thread count: the same bits
// on any number of threads.
#include "kernels/flash_attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kernels/kernels.h"
#include "kernels/vec_math.h"

namespace mt::kernels {
namespace {

constexpr int64_t kBr = kFlashQueryBlock, kBc = kFlashKeyBlock;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Per thread, grown once (the steady state allocates nothing).
struct Scratch {
  std::vector<float> s, dp, acc, m, l, dk, dv, delta;
  void fit(int64_t hd, int64_t Tq) {
    auto grow = [](std::vector<float>& v, int64_t n) {
      if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
    };
    grow(s, kBr * kBc);
    grow(dp, kBr * kBc);
    grow(acc, kBr * hd);
    grow(m, kBr);
    grow(l, kBr);
    grow(dk, kBc * hd);
    grow(dv, kBc * hd);
    grow(delta, Tq);
  }
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

void check_piece(const AttentionPiece& s) {
  if (s.B < 0 || s.NH < 1 || s.hd < 1 || s.Tq < 0 || s.Tk < 0 || s.kv_group < 1 ||
      s.NH % s.kv_group != 0)
    fail("flash attention: bad shape B={} NH={} hd={} Tq={} Tk={} kv_group={}", s.B, s.NH, s.hd,
         s.Tq, s.Tk, s.kv_group);
}

// Keys [0, n) of the piece (local indices) that query row t (local) sees.
int64_t visible_keys(const AttentionPiece& s, int64_t t) {
  if (!s.causal) return s.Tk;
  return std::clamp<int64_t>(s.q_pos0 + t - s.k_pos0 + 1, 0, s.Tk);
}

// The first query row (local) that sees key j (local): causal rows at positions >= j's.
int64_t first_query_seeing(const AttentionPiece& s, int64_t j) {
  if (!s.causal) return 0;
  return std::clamp<int64_t>(s.k_pos0 + j - s.q_pos0, 0, s.Tq);
}

const float* at(HeadRows r, int64_t b, int64_t t, int64_t h, int64_t hd) {
  return r.p + b * r.batch_stride + t * r.row_stride + h * hd;
}
float* at(HeadRowsOut r, int64_t b, int64_t t, int64_t h, int64_t hd) {
  return r.p + b * r.batch_stride + t * r.row_stride + h * hd;
}

// One query block of one head: rows [r0, r1) of the piece.
void forward_block(const AttentionPiece& s, HeadRows q, HeadRows k, HeadRows v, HeadRowsOut o,
                   float* lse, int64_t b, int64_t h, int64_t r0, int64_t r1, float scale,
                   Scratch& w) {
  const int64_t hd = s.hd, rows = r1 - r0, kh = h / s.kv_group;
  const int64_t kend = visible_keys(s, r1 - 1);  // the block's last row sees the most
  float* S = w.s.data();
  float* acc = w.acc.data();
  float* m = w.m.data();
  float* l = w.l.data();
  std::fill(acc, acc + rows * hd, 0.0f);
  std::fill(m, m + rows, kNegInf);
  std::fill(l, l + rows, 0.0f);
  const float* qb = at(q, b, r0, h, hd);
  for (int64_t c0 = 0; c0 < kend; c0 += kBc) {
    const int64_t c1 = std::min(kend, c0 + kBc), cols = c1 - c0;
    gemm(false, true, rows, cols, hd, scale, qb, q.row_stride, at(k, b, c0, kh, hd), k.row_stride,
         0.0f, S, kBc);
    for (int64_t i = 0; i < rows; ++i) {
      float* srow = S + i * kBc;
      const int64_t valid = std::clamp<int64_t>(visible_keys(s, r0 + i) - c0, 0, cols);
      if (valid == 0) {
        std::fill(srow, srow + cols, 0.0f);
        continue;
      }
      float mx = srow[0];
#pragma omp simd reduction(max : mx)
      for (int64_t j = 0; j < valid; ++j) mx = detail::max_of(mx, srow[j]);
      const float m_new = std::max(m[i], mx);
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < valid; ++j) {
        const float e = detail::fast_exp(srow[j] - m_new);
        srow[j] = e;
        sum += e;
      }
      std::fill(srow + valid, srow + cols, 0.0f);
      if (m[i] != kNegInf && m[i] != m_new) {
        const float alpha = detail::fast_exp(m[i] - m_new);
        float* arow = acc + i * hd;
#pragma omp simd
        for (int64_t d = 0; d < hd; ++d) arow[d] *= alpha;
        l[i] *= alpha;
      }
      l[i] += sum;
      m[i] = m_new;
    }
    gemm(false, false, rows, hd, cols, 1.0f, S, kBc, at(v, b, c0, kh, hd), v.row_stride, 1.0f, acc,
         hd);
  }
  for (int64_t i = 0; i < rows; ++i) {
    float* orow = at(o, b, r0 + i, h, hd);
    const float inv = l[i] > 0 ? 1.0f / l[i] : 0.0f;
    const float* arow = acc + i * hd;
#pragma omp simd
    for (int64_t d = 0; d < hd; ++d) orow[d] = arow[d] * inv;
    lse[(b * s.NH + h) * s.lse_ld() + r0 + i] = l[i] > 0 ? m[i] + std::log(l[i]) : kNegInf;
  }
}

void backward_head(const AttentionPiece& s, HeadRows q, HeadRows k, HeadRows v, HeadRows o,
                   HeadRows dout, const float* lse, HeadRowsOut dq, HeadRowsOut dk, HeadRowsOut dv,
                   int64_t b, int64_t h, float scale, Scratch& w) {
  const int64_t hd = s.hd, kh = h / s.kv_group;
  const float* lrow = lse + (b * s.NH + h) * s.lse_ld();
  float* D = w.delta.data();
  for (int64_t t = 0; t < s.Tq; ++t) {
    const float* orow = at(o, b, t, h, hd);
    const float* drow = at(dout, b, t, h, hd);
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int64_t d = 0; d < hd; ++d) dot += orow[d] * drow[d];
    D[t] = dot;
  }
  float* P = w.s.data();
  float* dS = w.dp.data();
  float* dK = w.dk.data();
  float* dV = w.dv.data();
  for (int64_t c0 = 0; c0 < s.Tk; c0 += kBc) {
    const int64_t c1 = std::min(s.Tk, c0 + kBc), cols = c1 - c0;
    const int64_t t_first = first_query_seeing(s, c0);
    if (t_first >= s.Tq) break;  // later key blocks are seen by no query either
    std::fill(dK, dK + cols * hd, 0.0f);
    std::fill(dV, dV + cols * hd, 0.0f);
    const float* kb = at(k, b, c0, kh, hd);
    const float* vb = at(v, b, c0, kh, hd);
    for (int64_t r0 = t_first / kBr * kBr; r0 < s.Tq; r0 += kBr) {
      const int64_t r1 = std::min(s.Tq, r0 + kBr), rows = r1 - r0;
      const float* qb = at(q, b, r0, h, hd);
      const float* db = at(dout, b, r0, h, hd);
      gemm(false, true, rows, cols, hd, scale, qb, q.row_stride, kb, k.row_stride, 0.0f, P, kBc);
      for (int64_t i = 0; i < rows; ++i) {
        float* prow = P + i * kBc;
        const int64_t valid = std::clamp<int64_t>(visible_keys(s, r0 + i) - c0, 0, cols);
        const float lt = lrow[r0 + i];
#pragma omp simd
        for (int64_t j = 0; j < valid; ++j) prow[j] = detail::fast_exp(prow[j] - lt);
        std::fill(prow + valid, prow + cols, 0.0f);
      }
      // dV += Pᵀ·dO
      gemm(true, false, cols, hd, rows, 1.0f, P, kBc, db, dout.row_stride, 1.0f, dV, hd);
      // dP = dO·Vᵀ, then dS = P ∘ (dP − D)·scale (0 where P is 0: masked keys).
      gemm(false, true, rows, cols, hd, 1.0f, db, dout.row_stride, vb, v.row_stride, 0.0f, dS, kBc);
      for (int64_t i = 0; i < rows; ++i) {
        float* srow = dS + i * kBc;
        const float* prow = P + i * kBc;
        const float dt = D[r0 + i];
#pragma omp simd
        for (int64_t j = 0; j < cols; ++j) srow[j] = prow[j] * (srow[j] - dt) * scale;
      }
      // dQ += dS·K; dK += dSᵀ·Q
      gemm(false, false, rows, hd, cols, 1.0f, dS, kBc, kb, k.row_stride, 1.0f,
           at(dq, b, r0, h, hd), dq.row_stride);
      gemm(true, false, cols, hd, rows, 1.0f, dS, kBc, qb, q.row_stride, 1.0f, dK, hd);
    }
    for (int64_t j = 0; j < cols; ++j) {
      float* kout = at(dk, b, c0 + j, kh, hd);
      float* vout = at(dv, b, c0 + j, kh, hd);
      const float* kin = dK + j * hd;
      const float* vin = dV + j * hd;
#pragma omp simd
      for (int64_t d = 0; d < hd; ++d) {
        kout[d] += kin[d];
        vout[d] += vin[d];
      }
    }
  }
}

}  // namespace

void flash_attention_forward(const AttentionPiece& s, HeadRows q, HeadRows k, HeadRows v,
                             HeadRowsOut o, float* lse) {
  check_piece(s);
  const int64_t nq = (s.Tq + kBr - 1) / kBr, tasks = s.B * s.NH * nq;
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.hd));
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < tasks; ++i) {
    const int64_t bh = i / nq, qb = i % nq;
    Scratch& w = scratch();
    w.fit(s.hd, 0);
    const int64_t r0 = qb * kBr;
    forward_block(s, q, k, v, o, lse, bh / s.NH, bh % s.NH, r0, std::min(s.Tq, r0 + kBr), scale, w);
  }
}

void flash_attention_backward(const AttentionPiece& s, HeadRows q, HeadRows k, HeadRows v,
                              HeadRows o, HeadRows dout, const float* lse, HeadRowsOut dq,
                              HeadRowsOut dk, HeadRowsOut dv) {
  check_piece(s);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.hd));
  // One task per (b, key/value head): the query heads sharing it add into its dk and dv one
  // after another, in head order.
  const int64_t kvh = s.NH / s.kv_group;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t bk = 0; bk < s.B * kvh; ++bk) {
    Scratch& w = scratch();
    w.fit(s.hd, s.Tq);
    for (int64_t m = 0; m < s.kv_group; ++m)
      backward_head(s, q, k, v, o, dout, lse, dq, dk, dv, bk / kvh, bk % kvh * s.kv_group + m,
                    scale, w);
  }
}

void attention_merge(const AttentionPiece& s, HeadRowsOut o, float* lse, HeadRows o2,
                     const float* lse2) {
  const int64_t hd = s.hd;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < s.B * s.NH * s.Tq; ++i) {
    const int64_t bh = i / s.Tq, t = i % s.Tq, b = bh / s.NH, h = bh % s.NH;
    const int64_t li = bh * s.lse_ld() + t;
    const float a = lse[li], c = lse2[li];
    if (c == kNegInf) continue;
    float* orow = at(o, b, t, h, hd);
    const float* o2row = at(o2, b, t, h, hd);
    if (a == kNegInf) {
      std::copy(o2row, o2row + hd, orow);
      lse[li] = c;
      continue;
    }
    // lse = log(e^a + e^c) = mx + log(e^(a−mx) + e^(c−mx)); o = (e^a·o + e^c·o2) / e^lse.
    const float mx = std::max(a, c);
    const float ea = std::exp(a - mx), ec = std::exp(c - mx), sum = ea + ec;
    const float wa = ea / sum, wc = ec / sum;
#pragma omp simd
    for (int64_t d = 0; d < hd; ++d) orow[d] = wa * orow[d] + wc * o2row[d];
    lse[li] = mx + std::log(sum);
  }
}

int64_t flash_attention_block_pairs(const AttentionPiece& s) {
  int64_t pairs = 0;
  for (int64_t r0 = 0; r0 < s.Tq; r0 += kBr) {
    const int64_t kend = visible_keys(s, std::min(s.Tq, r0 + kBr) - 1);
    pairs += (kend + kBc - 1) / kBc;
  }
  return pairs * s.B * s.NH;
}

void flash_attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T,
                             int64_t C, int64_t NH) {
  if (NH < 1 || C % NH != 0) fail("attention: C={} is not divisible by NH={}", C, NH);
  const AttentionPiece s{B, NH, C / NH, T, T, 0, 0, true, 0, 1};
  const int64_t C3 = 3 * C;
  flash_attention_forward(s, {qkv, C3, T * C3}, {qkv + C, C3, T * C3}, {qkv + 2 * C, C3, T * C3},
                          {out, C, T * C}, lse);
}

void flash_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                              const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH) {
  if (NH < 1 || C % NH != 0) fail("attention: C={} is not divisible by NH={}", C, NH);
  const AttentionPiece s{B, NH, C / NH, T, T, 0, 0, true, 0, 1};
  const int64_t C3 = 3 * C;
  std::fill(dqkv, dqkv + B * T * C3, 0.0f);
  flash_attention_backward(s, {qkv, C3, T * C3}, {qkv + C, C3, T * C3}, {qkv + 2 * C, C3, T * C3},
                           {out, C, T * C}, {dout, C, T * C}, lse, {dqkv, C3, T * C3},
                           {dqkv + C, C3, T * C3}, {dqkv + 2 * C, C3, T * C3});
}

}  // namespace mt::kernels

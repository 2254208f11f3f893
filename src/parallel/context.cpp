#include "parallel/context.h"

#include <algorithm>
#include <limits>
#include <optional>

#include "core/error.h"
#include "core/profile.h"
#include "kernels/flash_attention.h"
#include "kernels/kernels.h"

namespace mt::parallel::cp {

CpComm parse_cp_comm(const std::string& name) {
  if (name == "ring") return CpComm::kRing;
  if (name == "all-gather") return CpComm::kAllGather;
  if (name == "a2a") return CpComm::kA2a;
  fail("--cp-comm '{}' is not a context-parallel exchange (choose ring, all-gather or a2a)", name);
}

const char* cp_comm_name(CpComm c) {
  switch (c) {
    case CpComm::kRing:
      return "ring";
    case CpComm::kAllGather:
      return "all-gather";
    case CpComm::kA2a:
      return "a2a";
  }
  return "?";
}

int64_t CpContext::piece_start(int64_t T, int k, int r) const {
  if (size == 1) return 0;
  if (contiguous) return r * (T / size);
  const int64_t c = T / (2 * size);
  return (k == 0 ? r : 2 * size - 1 - r) * c;
}

int64_t CpContext::position(int64_t T, int64_t t, int r) const {
  const int64_t len = piece_len(T);
  return piece_start(T, static_cast<int>(t / len), r) + t % len;
}

std::vector<int32_t> CpContext::positions(int64_t T) const {
  std::vector<int32_t> p(static_cast<size_t>(local_len(T)));
  for (int64_t t = 0; t < local_len(T); ++t) p[static_cast<size_t>(t)] = int32_t(position(T, t));
  return p;
}

void check_split(int64_t T, int cp) {
  if (cp < 1) fail("--cp {} must be at least 1", cp);
  if (cp == 1) return;
  if (T % (2 * cp) != 0) {
    const int64_t down = T / (2 * cp) * (2 * cp), up = down + 2 * cp;
    fail(
        "--seq {} is not divisible by 2 x --cp {} = {}: context parallelism cuts every sequence "
        "into 2 x cp chunks of equal length (use --seq {}{}, or a --cp whose double divides {})",
        T, cp, 2 * cp, down > 0 ? std::to_string(down) + " or " : std::string(), up, T);
  }
}

void check_a2a(int64_t heads, int64_t kv_heads, int64_t T, int cp) {
  if (cp <= 1 || (heads % cp == 0 && kv_heads % cp == 0)) return;
  std::string valid;
  for (int d = 2; d <= kv_heads; ++d)
    if (heads % d == 0 && kv_heads % d == 0 && T % (2 * d) == 0)
      valid += (valid.empty() ? "" : ", ") + std::to_string(d);
  fail(
      "--cp-comm a2a splits the heads over cp: {} query heads and {} key/value heads per tp "
      "rank do not divide by --cp {} (use --cp {}, or --cp-comm ring)",
      heads, kv_heads, cp, valid.empty() ? std::string("1") : "among " + valid);
}

namespace {

int64_t kv_width(const AttentionShape& s) { return 2 * s.kv_heads * s.hd; }

// Local query piece a (rows [a·len, (a+1)·len) of every sequence) against keys at
// [k_pos0, k_pos0 + Tk) whose rows are `kv_rows` apart.
kernels::AttentionPiece piece_of(const CpContext& cp, const AttentionShape& s, int a,
                                 int64_t k_pos0, int64_t Tk) {
  kernels::AttentionPiece p;
  p.B = s.B;
  p.NH = s.heads;
  p.hd = s.hd;
  p.Tq = cp.piece_len(s.T);
  p.Tk = Tk;
  p.q_pos0 = cp.piece_start(s.T, a);
  p.k_pos0 = k_pos0;
  p.causal = true;
  p.lse_stride = cp.local_len(s.T);
  p.kv_group = s.heads / s.kv_heads;
  return p;
}

// All-gather: local piece a against every key up to its end (positions [0, q0 + len)).
kernels::AttentionPiece gathered_piece(const CpContext& cp, const AttentionShape& s, int a) {
  return piece_of(cp, s, a, 0, cp.piece_start(s.T, a) + cp.piece_len(s.T));
}

// The views of one operand (rows `ld` apart, sequences `batch` apart), from row r0.
kernels::HeadRows rows(const float* p, int64_t r0, int64_t ld, int64_t batch) {
  return {p + r0 * ld, ld, batch};
}
kernels::HeadRowsOut rows(float* p, int64_t r0, int64_t ld, int64_t batch) {
  return {p + r0 * ld, ld, batch};
}

void pack_kv(const AttentionShape& s, int64_t n_rows, const float* qkv, float* out) {
  const int64_t W = kv_width(s);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < n_rows; ++r) std::copy_n(qkv + r * s.qkv_ld + s.kv_col, W, out + r * W);
}

void unpack_dkv(const AttentionShape& s, int64_t n_rows, const float* in, float* dqkv) {
  const int64_t W = kv_width(s);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < n_rows; ++r) std::copy_n(in + r * W, W, dqkv + r * s.qkv_ld + s.kv_col);
}

// ---- all-gather ----------------------------------------------------------------------

// Every rank's k | v in w.kv ([B, T, W], global order).
void gather_kv(const CpContext& cp, const AttentionShape& s, const float* qkv, const Workspace& w) {
  const int64_t Tl = cp.local_len(s.T), n_rows = s.B * Tl, W = kv_width(s);
  pack_kv(s, n_rows, qkv, w.local);
  {
    profile::Scope p("cp.comm");
    cp.group->all_gather(comm::device_buf(w.local, n_rows * W),
                         comm::device_buf(w.ranked, cp.size * n_rows * W));
  }
  const int64_t n = cp.size * n_rows;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const int r = static_cast<int>(i / n_rows);
    const int64_t b = i % n_rows / Tl, t = i % Tl;
    std::copy_n(w.ranked + i * W, W, w.kv + (b * s.T + cp.position(s.T, t, r)) * W);
  }
}

void all_gather_forward(const CpContext& cp, const AttentionShape& s, const float* qkv, float* out,
                        float* lse, const Workspace& w) {
  gather_kv(cp, s, qkv, w);
  const int64_t C = s.heads * s.hd, Ckv = s.kv_heads * s.hd, W = kv_width(s);
  const int64_t Tl = cp.local_len(s.T), len = cp.piece_len(s.T);
  for (int a = 0; a < cp.pieces(); ++a)
    kernels::flash_attention_forward(gathered_piece(cp, s, a),
                                     rows(qkv, a * len, s.qkv_ld, Tl * s.qkv_ld),
                                     rows(w.kv, 0, W, s.T * W), rows(w.kv + Ckv, 0, W, s.T * W),
                                     rows(out, a * len, C, Tl * C), lse + a * len);
}

void all_gather_backward(const CpContext& cp, const AttentionShape& s, const float* qkv,
                         const float* out, const float* lse, const float* dout, float* dqkv,
                         const Workspace& w) {
  gather_kv(cp, s, qkv, w);  // again: keeping them would cost 2·C·T floats per layer
  const int64_t C = s.heads * s.hd, Ckv = s.kv_heads * s.hd, W = kv_width(s);
  const int64_t Tl = cp.local_len(s.T), len = cp.piece_len(s.T), n_rows = s.B * Tl;
  std::fill_n(w.dkv, s.B * s.T * W, 0.0f);
  for (int a = 0; a < cp.pieces(); ++a)
    kernels::flash_attention_backward(
        gathered_piece(cp, s, a), rows(qkv, a * len, s.qkv_ld, Tl * s.qkv_ld),
        rows(w.kv, 0, W, s.T * W), rows(w.kv + Ckv, 0, W, s.T * W), rows(out, a * len, C, Tl * C),
        rows(dout, a * len, C, Tl * C), lse + a * len, rows(dqkv, a * len, s.qkv_ld, Tl * s.qkv_ld),
        rows(w.dkv, 0, W, s.T * W), rows(w.dkv + Ckv, 0, W, s.T * W));
  // Each rank's rows of dk | dv in rank order; the reduce-scatter adds every rank's share of
  // this rank's rows.
  const int64_t n = cp.size * n_rows;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const int r = static_cast<int>(i / n_rows);
    const int64_t b = i % n_rows / Tl, t = i % Tl;
    std::copy_n(w.dkv + (b * s.T + cp.position(s.T, t, r)) * W, W, w.ranked + i * W);
  }
  {
    profile::Scope p("cp.comm");
    cp.group->reduce_scatter(comm::device_buf(w.ranked, n * W),
                             comm::device_buf(w.local, n_rows * W));
  }
  unpack_dkv(s, n_rows, w.local, dqkv);
}

// ---- ring ----------------------------------------------------------------------------
// Step k (0 <= k < N): rank i holds rank (i − k)'s K|V block (its own first) and attends
// its query pieces to the block's chunks it can see: chunk b of rank j starts at
// piece_start(T, b, j); a whole chunk after a query piece's last position is skipped.

constexpr int kKvTag = 0, kGradTag = 1;

int next_rank(const CpContext& cp) { return (cp.rank + 1) % cp.size; }
int prev_rank(const CpContext& cp) { return (cp.rank + cp.size - 1) % cp.size; }

// Sends `out` to the next rank and receives `in` from the previous one, both started now.
struct Exchange {
  comm::WorkPtr send, recv;
  Exchange(const CpContext& cp, float* out, float* in, int64_t elems, int tag) {
    profile::Scope p("cp.comm");
    recv = cp.group->recv_async(comm::device_buf(in, elems), prev_rank(cp), tag);
    send = cp.group->send_async(comm::device_buf(out, elems), next_rank(cp), tag);
  }
  void wait() {
    profile::Scope p("cp.comm");
    send->wait();
    recv->wait();
  }
};

template <class F>
void for_each_visible(const CpContext& cp, const AttentionShape& s, int src, F&& f) {
  const int64_t len = cp.piece_len(s.T);
  for (int a = 0; a < cp.pieces(); ++a)
    for (int b = 0; b < cp.pieces(); ++b) {
      const int64_t k0 = cp.piece_start(s.T, b, src);
      if (k0 > cp.piece_start(s.T, a) + len - 1) continue;  // every key after every query
      f(a, b, piece_of(cp, s, a, k0, len));
    }
}

void ring_forward(const CpContext& cp, const AttentionShape& s, const float* qkv, float* out,
                  float* lse, const Workspace& w) {
  const int64_t C = s.heads * s.hd, Ckv = s.kv_heads * s.hd, W = kv_width(s);
  const int64_t Tl = cp.local_len(s.T), len = cp.piece_len(s.T), n_rows = s.B * Tl;
  pack_kv(s, n_rows, qkv, w.local);
  std::fill_n(out, n_rows * C, 0.0f);
  std::fill_n(lse, s.B * s.heads * Tl, -std::numeric_limits<float>::infinity());
  float *cur = w.local, *nxt = w.ranked;
  for (int k = 0; k < cp.size; ++k) {
    const int src = (cp.rank + cp.size - k) % cp.size;
    std::optional<Exchange> x;
    if (k + 1 < cp.size) x.emplace(cp, cur, nxt, n_rows * W, kKvTag);  // overlaps the attention
    for_each_visible(cp, s, src, [&](int a, int b, const kernels::AttentionPiece& p) {
      kernels::flash_attention_forward(
          p, rows(qkv, a * len, s.qkv_ld, Tl * s.qkv_ld), rows(cur, b * len, W, Tl * W),
          rows(cur + Ckv, b * len, W, Tl * W), rows(w.o, a * len, C, Tl * C), w.lse + a * len);
      kernels::attention_merge(p, rows(out, a * len, C, Tl * C), lse + a * len,
                               rows(static_cast<const float*>(w.o), a * len, C, Tl * C),
                               w.lse + a * len);
    });
    if (x) {
      x->wait();
      std::swap(cur, nxt);
    }
  }
}

void ring_backward(const CpContext& cp, const AttentionShape& s, const float* qkv, const float* out,
                   const float* lse, const float* dout, float* dqkv, const Workspace& w) {
  const int64_t C = s.heads * s.hd, Ckv = s.kv_heads * s.hd, W = kv_width(s);
  const int64_t Tl = cp.local_len(s.T), len = cp.piece_len(s.T), n_rows = s.B * Tl;
  pack_kv(s, n_rows, qkv, w.local);
  float *cur = w.local, *nxt = w.ranked, *dcur = w.kv, *dnxt = w.dkv;
  std::fill_n(dcur, n_rows * W, 0.0f);
  for (int k = 0; k < cp.size; ++k) {
    const int src = (cp.rank + cp.size - k) % cp.size;
    std::optional<Exchange> x;
    if (k + 1 < cp.size) x.emplace(cp, cur, nxt, n_rows * W, kKvTag);  // overlaps the attention
    for_each_visible(cp, s, src, [&](int a, int b, const kernels::AttentionPiece& p) {
      kernels::flash_attention_backward(
          p, rows(qkv, a * len, s.qkv_ld, Tl * s.qkv_ld), rows(cur, b * len, W, Tl * W),
          rows(cur + Ckv, b * len, W, Tl * W), rows(out, a * len, C, Tl * C),
          rows(dout, a * len, C, Tl * C), lse + a * len,
          rows(dqkv, a * len, s.qkv_ld, Tl * s.qkv_ld), rows(dcur, b * len, W, Tl * W),
          rows(dcur + Ckv, b * len, W, Tl * W));
    });
    // The block's dk | dv go on with it (after the last step: home to their owner).
    Exchange g(cp, dcur, dnxt, n_rows * W, kGradTag);
    g.wait();
    if (x) x->wait();
    std::swap(cur, nxt);
    std::swap(dcur, dnxt);
  }
  unpack_dkv(s, n_rows, dcur, dqkv);
}

// ---- a2a (DeepSpeed-Ulysses) ------------------------------------------------------------
// Rank r of N takes head group r: query heads [r·H/N, (r+1)·H/N) and kv heads
// [r·KV/N, (r+1)·KV/N) (H, KV: this tp rank's; query head h reads kv head h / (H/KV), which
// stays in the group). One all-to-all hands every rank its group's q | k | v of every
// position; the kernel runs on whole sequences; a second all-to-all hands the outputs back.

int64_t group_width(const AttentionShape& s, int n) {  // q | k | v floats of a head group
  return (s.heads + 2 * s.kv_heads) / n * s.hd;
}

// The columns of head group g in a [.., qkv_ld] row, as (offset, floats) runs: q, k, v.
struct Runs {
  int64_t off[3], len[3];
};
Runs group_runs(const AttentionShape& s, int n, int g) {
  const int64_t hq = s.heads / n * s.hd, hk = s.kv_heads / n * s.hd, Ckv = s.kv_heads * s.hd;
  return {{g * hq, s.kv_col + g * hk, s.kv_col + Ckv + g * hk}, {hq, hk, hk}};
}

// send[g][row] = the head group g columns of local row `row` of qkv; then all_to_all; then
// w.kv[b, pos, :] = what rank src sent for its row t. After it, w.kv holds this rank's head
// group's q | k | v of every position, in global order ([B, T, Wg]).
void scatter_heads(const CpContext& cp, const AttentionShape& s, const float* qkv,
                   const Workspace& w) {
  const int n = cp.size;
  const int64_t Tl = cp.local_len(s.T), n_rows = s.B * Tl, Wg = group_width(s, n);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n * n_rows; ++i) {
    const int g = static_cast<int>(i / n_rows);
    const int64_t r = i % n_rows;
    const Runs u = group_runs(s, n, g);
    float* dst = w.local + i * Wg;
    for (int k = 0; k < 3; ++k) dst = std::copy_n(qkv + r * s.qkv_ld + u.off[k], u.len[k], dst);
  }
  {
    profile::Scope p("cp.comm");
    cp.group->all_to_all(comm::device_buf(w.local, n * n_rows * Wg),
                         comm::device_buf(w.ranked, n * n_rows * Wg));
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n * n_rows; ++i) {
    const int src = static_cast<int>(i / n_rows);
    const int64_t b = i % n_rows / Tl, t = i % Tl;
    std::copy_n(w.ranked + i * Wg, Wg, w.kv + (b * s.T + cp.position(s.T, t, src)) * Wg);
  }
}

// The head-group rows `x` ([B, T, width], global order) of every rank's positions back to
// their owners: out[row, g·width ...] (rows `ld` apart) = rank g's group for this rank's rows.
void gather_heads(const CpContext& cp, const AttentionShape& s, const float* x, int64_t width,
                  float* out, int64_t ld, const Workspace& w) {
  const int n = cp.size;
  const int64_t Tl = cp.local_len(s.T), n_rows = s.B * Tl;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n * n_rows; ++i) {
    const int dst = static_cast<int>(i / n_rows);
    const int64_t b = i % n_rows / Tl, t = i % Tl;
    std::copy_n(x + (b * s.T + cp.position(s.T, t, dst)) * width, width, w.local + i * width);
  }
  {
    profile::Scope p("cp.comm");
    cp.group->all_to_all(comm::device_buf(w.local, n * n_rows * width),
                         comm::device_buf(w.ranked, n * n_rows * width));
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n * n_rows; ++i) {
    const int64_t g = i / n_rows, r = i % n_rows;
    std::copy_n(w.ranked + i * width, width, out + r * ld + g * width);
  }
}

// The reverse of gather_heads for o-like rows: local out[row, g·width ...] to head group g's
// owner, placed at its global position in x ([B, T, width]).
void scatter_rows(const CpContext& cp, const AttentionShape& s, const float* in, int64_t ld,
                  int64_t width, float* x, const Workspace& w) {
  const int n = cp.size;
  const int64_t Tl = cp.local_len(s.T), n_rows = s.B * Tl;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n * n_rows; ++i) {
    const int64_t g = i / n_rows, r = i % n_rows;
    std::copy_n(in + r * ld + g * width, width, w.local + i * width);
  }
  {
    profile::Scope p("cp.comm");
    cp.group->all_to_all(comm::device_buf(w.local, n * n_rows * width),
                         comm::device_buf(w.ranked, n * n_rows * width));
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n * n_rows; ++i) {
    const int src = static_cast<int>(i / n_rows);
    const int64_t b = i % n_rows / Tl, t = i % Tl;
    std::copy_n(w.ranked + i * width, width, x + (b * s.T + cp.position(s.T, t, src)) * width);
  }
}

kernels::AttentionPiece whole_piece(const CpContext& cp, const AttentionShape& s) {
  kernels::AttentionPiece p;
  p.B = s.B;
  p.NH = s.heads / cp.size;
  p.hd = s.hd;
  p.Tq = s.T;
  p.Tk = s.T;
  p.kv_group = s.heads / s.kv_heads;
  return p;
}

void a2a_forward(const CpContext& cp, const AttentionShape& s, const float* qkv, float* out,
                 float* lse, const Workspace& w) {
  const int n = cp.size;
  const int64_t Wg = group_width(s, n), hq = s.heads / n * s.hd, hk = s.kv_heads / n * s.hd;
  const int64_t C = s.heads * s.hd;
  scatter_heads(cp, s, qkv, w);
  float* oh = w.o;  // [B, T, hq]
  // lse: [B, H/N, T] of this rank's head group (as many floats as [B, H, T/N]).
  kernels::flash_attention_forward(
      whole_piece(cp, s), rows(w.kv, 0, Wg, s.T * Wg), rows(w.kv + hq, 0, Wg, s.T * Wg),
      rows(w.kv + hq + hk, 0, Wg, s.T * Wg), rows(oh, 0, hq, s.T * hq), lse);
  gather_heads(cp, s, oh, hq, out, C, w);
}

void a2a_backward(const CpContext& cp, const AttentionShape& s, const float* qkv, const float* out,
                  const float* lse, const float* dout, float* dqkv, const Workspace& w) {
  const int n = cp.size;
  const int64_t Wg = group_width(s, n), hq = s.heads / n * s.hd, hk = s.kv_heads / n * s.hd;
  const int64_t C = s.heads * s.hd, Tl = cp.local_len(s.T), n_rows = s.B * Tl;
  scatter_heads(cp, s, qkv, w);  // again, as the all-gather variant does
  float* oh = w.o;               // [B, T, hq]: the outputs, then their gradients
  float* doh = w.o + s.B * s.T * hq;
  scatter_rows(cp, s, out, C, hq, oh, w);
  scatter_rows(cp, s, dout, C, hq, doh, w);
  std::fill_n(w.dkv, s.B * s.T * Wg, 0.0f);
  kernels::flash_attention_backward(
      whole_piece(cp, s), rows(w.kv, 0, Wg, s.T * Wg), rows(w.kv + hq, 0, Wg, s.T * Wg),
      rows(w.kv + hq + hk, 0, Wg, s.T * Wg), rows(oh, 0, hq, s.T * hq), rows(doh, 0, hq, s.T * hq),
      lse, rows(w.dkv, 0, Wg, s.T * Wg), rows(w.dkv + hq, 0, Wg, s.T * Wg),
      rows(w.dkv + hq + hk, 0, Wg, s.T * Wg));
  // Back to the rows' owners: dq | dk | dv of head group g into its columns of dqkv.
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n * n_rows; ++i) {
    const int dst = static_cast<int>(i / n_rows);
    const int64_t b = i % n_rows / Tl, t = i % Tl;
    std::copy_n(w.dkv + (b * s.T + cp.position(s.T, t, dst)) * Wg, Wg, w.local + i * Wg);
  }
  {
    profile::Scope p("cp.comm");
    cp.group->all_to_all(comm::device_buf(w.local, n * n_rows * Wg),
                         comm::device_buf(w.ranked, n * n_rows * Wg));
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n * n_rows; ++i) {
    const int g = static_cast<int>(i / n_rows);
    const int64_t r = i % n_rows;
    const Runs u = group_runs(s, n, g);
    const float* src = w.ranked + i * Wg;
    for (int k = 0; k < 3; ++k) {
      std::copy_n(src, u.len[k], dqkv + r * s.qkv_ld + u.off[k]);
      src += u.len[k];
    }
  }
}

}  // namespace

WorkspaceElems workspace_elems(const CpContext& cp, const AttentionShape& s) {
  const int64_t block = s.B * cp.local_len(s.T) * kv_width(s);
  if (cp.comm == CpComm::kAllGather)
    return {block, cp.size * block, s.B * s.T * kv_width(s), s.B * s.T * kv_width(s), 1, 1};
  if (cp.comm == CpComm::kA2a) {
    const int64_t g = s.B * s.T * group_width(s, cp.size);
    return {g, g, g, g, 2 * s.B * s.T * (s.heads / cp.size) * s.hd, 1};
  }
  return {block,
          block,
          block,
          block,
          s.B * cp.local_len(s.T) * s.heads * s.hd,
          s.B * s.heads * cp.local_len(s.T)};
}

void attention_forward(const CpContext& cp, const AttentionShape& s, const float* qkv, float* out,
                       float* lse, const Workspace& w) {
  MT_ASSERT(cp.active() && s.heads % s.kv_heads == 0);
  if (cp.comm == CpComm::kRing) return ring_forward(cp, s, qkv, out, lse, w);
  if (cp.comm == CpComm::kA2a) return a2a_forward(cp, s, qkv, out, lse, w);
  all_gather_forward(cp, s, qkv, out, lse, w);
}

void attention_backward(const CpContext& cp, const AttentionShape& s, const float* qkv,
                        const float* out, const float* lse, const float* dout, float* dqkv,
                        const Workspace& w) {
  MT_ASSERT(cp.active() && s.heads % s.kv_heads == 0);
  const int64_t C = s.heads * s.hd, n_rows = s.B * cp.local_len(s.T);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < n_rows; ++r) std::fill_n(dqkv + r * s.qkv_ld, C, 0.0f);  // dq +=
  if (cp.comm == CpComm::kRing) return ring_backward(cp, s, qkv, out, lse, dout, dqkv, w);
  if (cp.comm == CpComm::kA2a) return a2a_backward(cp, s, qkv, out, lse, dout, dqkv, w);
  all_gather_backward(cp, s, qkv, out, lse, dout, dqkv, w);
}

int64_t attention_block_pairs(const CpContext& cp, const AttentionShape& s) {
  int64_t pairs = 0;
  if (cp.comm == CpComm::kA2a && cp.active())  // whole sequences, heads / N of them
    return kernels::flash_attention_block_pairs(whole_piece(cp, s));
  if (cp.comm == CpComm::kRing && cp.active()) {
    for (int src = 0; src < cp.size; ++src)
      for_each_visible(cp, s, src, [&](int, int, const kernels::AttentionPiece& p) {
        pairs += kernels::flash_attention_block_pairs(p);
      });
    return pairs;
  }
  for (int a = 0; a < cp.pieces(); ++a)
    pairs += kernels::flash_attention_block_pairs(gathered_piece(cp, s, a));
  return pairs;
}

}  // namespace mt::parallel::cp

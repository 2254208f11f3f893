// Mixed-precision kernels (mixed.h): bf16 conversions, the linear layer on bf16 operands
// through oneDNN's matmul (AMX here), and its backward with fp32 gradients.
#include "kernels/mixed.h"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <type_traits>

#include "core/device.h"
#include "core/error.h"
#include "core/profile.h"
#include "kernels/dispatch.h"
#include "kernels/gemm_internal.h"
#include "kernels/kernels.h"
#include "kernels/vec_math.h"

namespace mt::kernels {
namespace {

// Below this many elements a conversion runs on the calling thread (the fork costs more
// than the copy). Not through OpenMP's `if` clause: libgomp allocates a team even for a
// region it runs on one thread, a heap allocation per call in the steady state
// (tests/kernels/mixed_test.cpp counts them).
constexpr int64_t kParallelElems = int64_t{1} << 15;

// Rows [0, rows) and columns [0, cols) of dy (row stride ld) rounded into ws (row stride
// cols), and db[j] += the f32 column sums when db is set. With db the threads split the
// columns and each column adds its rows in order, as linear_backward's bias_grad does, so db
// does not depend on the thread count or on how the columns were chunked; without it they
// split the rows.
void round_block(bf16* ws, float* db, const float* dy, int64_t rows, int64_t cols, int64_t ld) {
  const bool parallel = rows * cols >= kParallelElems;
  if (!db) {
    auto row = [&](int64_t i) {
      const float* r = dy + i * ld;
      uint16_t* o = reinterpret_cast<uint16_t*>(ws + i * cols);
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) o[j] = detail::bf16_bits(r[j]);
    };
    if (!parallel) {
      for (int64_t i = 0; i < rows; ++i) row(i);
      return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < rows; ++i) row(i);
    return;
  }
  constexpr int64_t kCols = 64;
  const int64_t blocks = (cols + kCols - 1) / kCols;
  auto block = [&](int64_t blk) {
    const int64_t j0 = blk * kCols, j1 = std::min(cols, j0 + kCols);
    float acc[kCols] = {};
    for (int64_t i = 0; i < rows; ++i) {
      const float* r = dy + i * ld;
      uint16_t* o = reinterpret_cast<uint16_t*>(ws + i * cols);
#pragma omp simd
      for (int64_t j = j0; j < j1; ++j) {
        acc[j - j0] += r[j];
        o[j] = detail::bf16_bits(r[j]);
      }
    }
    for (int64_t j = j0; j < j1; ++j) db[j] += acc[j - j0];
  };
  if (!parallel) {
    for (int64_t blk = 0; blk < blocks; ++blk) block(blk);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) block(blk);
}

void check_linear(const char* what, int64_t n, int64_t in, int64_t out) {
  if (n < 0 || in < 0 || out < 0) fail("{}: negative size n={} in={} out={}", what, n, in, out);
}

template <class Y>
void forward_impl(Y* y, const bf16* x, const bf16* w, const float* b, int64_t n, int64_t in,
                  int64_t out, const float* r = nullptr) {
  check_linear("linear_forward_mixed", n, in, out);
  if (n == 0 || out == 0) return;
  if (in == 0) {  // an empty product: y = b (+ r) (oneDNN refuses empty reductions)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < out; ++j) {
        const float v = (b ? b[j] : 0.0f) + (r ? r[i * out + j] : 0.0f);
        if constexpr (std::is_same_v<Y, bf16>)
          y[i * out + j] = f32_to_bf16(v);
        else
          y[i * out + j] = v;
      }
    return;
  }
  detail::matmul_bf16(false, true, n, out, in, x, in, w, in, b, 0.0f, y, std::is_same_v<Y, bf16>,
                      out, r);
}

// Columns [c0, c0 + cols) of dy in bf16 (dyc: their first column, row stride ldy):
// dx[n, in] (+)= dyc · w[c0:c0+cols, :], the chunks' sum in f32 (beta 0 for the first), and
// dw[c0:c0+cols, :] += dycᵀ · x, each chunk its own rows of dw.
void column_chunk_gemms(float* dx, float* dw, const bf16* dyc, int64_t ldy, const bf16* x,
                        const bf16* w, int64_t n, int64_t in, int64_t c0, int64_t cols) {
  if (dx)
    gemm_bf16(false, false, n, in, cols, 1.0f, dyc, ldy, w + c0 * in, in, c0 == 0 ? 0.0f : 1.0f, dx,
              in);
  if (dw) gemm_bf16(true, false, cols, in, n, 1.0f, dyc, ldy, x, in, 1.0f, dw + c0 * in, in);
}

}  // namespace

void to_bf16(bf16* y, const float* x, int64_t n) {
  MT_CUDA_DISPATCH(to_bf16(y, x, n));
  uint16_t* o = reinterpret_cast<uint16_t*>(y);
  if (n < kParallelElems) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) o[i] = detail::bf16_bits(x[i]);
    return;
  }
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) o[i] = detail::bf16_bits(x[i]);
}

void to_f32(float* y, const bf16* x, int64_t n) {
  MT_CUDA_DISPATCH(to_f32(y, x, n));
  const uint16_t* in = reinterpret_cast<const uint16_t*>(x);
  if (n < kParallelElems) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = std::bit_cast<float>(static_cast<uint32_t>(in[i]) << 16);
    return;
  }
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = std::bit_cast<float>(static_cast<uint32_t>(in[i]) << 16);
}

void linear_forward_mixed(float* y, const bf16* x, const bf16* w, const float* b, int64_t n,
                          int64_t in, int64_t out) {
  MT_CUDA_DISPATCH(linear_forward_mixed(y, x, w, b, n, in, out));
  forward_impl(y, x, w, b, n, in, out);
}

void linear_forward_mixed(bf16* y, const bf16* x, const bf16* w, const float* b, int64_t n,
                          int64_t in, int64_t out) {
  MT_CUDA_DISPATCH(linear_forward_mixed(y, x, w, b, n, in, out));
  forward_impl(y, x, w, b, n, in, out);
}

void linear_forward_mixed_residual(float* y, const bf16* x, const bf16* w, const float* b,
                                   const float* r, int64_t n, int64_t in, int64_t out) {
  if (device::on_cuda()) fail("linear_forward_mixed_residual: the CPU's kernel");
  if (!r || r == y) fail("linear_forward_mixed_residual: the residual must be another buffer");
  forward_impl(y, x, w, b, n, in, out, r);
}

void linear_backward_mixed(float* dx, float* dw, float* db, const float* dy, const bf16* x,
                           const bf16* w, int64_t n, int64_t in, int64_t out, bf16* ws,
                           int64_t ws_elems) {
  MT_CUDA_DISPATCH(linear_backward_mixed(dx, dw, db, dy, x, w, n, in, out, ws, ws_elems));
  check_linear("linear_backward_mixed", n, in, out);
  if (n == 0 || out == 0) {
    if (dx && n > 0 && in > 0) std::fill(dx, dx + n * in, 0.0f);
    return;
  }
  if (!dx && !dw) {
    if (db) detail::bias_grad(db, dy, n, out);
    return;
  }
  // Column chunks when dy is wider than it is tall (the LM head's [n, vocab]): each chunk's
  // dw rows are written once, and only dx (n x in, small) is revisited. Row chunks otherwise:
  // each chunk revisits the whole dw.
  const bool one_pass = ws && ws_elems >= n * out;
  const bool by_cols = !one_pass && ws && n <= out && ws_elems >= n;
  if (!one_pass && !by_cols && (!ws || ws_elems < out))
    fail(
        "linear_backward_mixed: the bf16 workspace holds {} elements, fewer than one row of dy "
        "(out={}) and one column (n={}); give it linear_backward_mixed_ws_elems(n, out) = {} for "
        "one pass",
        ws ? ws_elems : 0, out, n, n * out);
  if (by_cols) {
    const int64_t chunk = linear_backward_mixed_chunk_cols(n, out, ws_elems);
    for (int64_t c0 = 0; c0 < out; c0 += chunk) {
      const int64_t cols = std::min(chunk, out - c0);
      {
        profile::Scope p("bf16.convert");  // the output gradient, rounded (+ the bias's sum)
        round_block(ws, db ? db + c0 : nullptr, dy + c0, n, cols, out);
      }
      if (in > 0) column_chunk_gemms(dx, dw, ws, cols, x, w, n, in, c0, cols);
    }
    return;
  }
  const int64_t chunk = one_pass ? n : std::min(n, ws_elems / out);
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t rows = std::min(chunk, n - r0);
    const float* dy_r = dy + r0 * out;
    {
      profile::Scope p("bf16.convert");  // the output gradient, rounded (+ the bias's sum)
      round_block(ws, db, dy_r, rows, out, out);
    }
    if (in == 0) continue;
    // dx[rows, in] = dy[rows, out] * w[out, in]
    if (dx) gemm_bf16(false, false, rows, in, out, 1.0f, ws, out, w, in, 0.0f, dx + r0 * in, in);
    // dw[out, in] += dy[rows, out]^T * x[rows, in], the sum added in f32 (beta = 1)
    if (dw) gemm_bf16(true, false, out, in, rows, 1.0f, ws, out, x + r0 * in, in, 1.0f, dw, in);
  }
}

void linear_backward_mixed(float* dx, float* dw, const bf16* dy, int64_t ldy, const bf16* x,
                           const bf16* w, int64_t n, int64_t in, int64_t out, int64_t chunk_cols) {
  if (device::on_cuda()) fail("linear_backward_mixed with a bf16 dy: the CPU only");
  if (n < 0 || in < 0 || out < 0 || chunk_cols < 1 || ldy < out)
    fail("linear_backward_mixed: bad shape n={} in={} out={} ldy={} chunk_cols={}", n, in, out, ldy,
         chunk_cols);
  if (n == 0 || out == 0 || in == 0) {
    if (dx && n > 0 && in > 0) std::fill(dx, dx + n * in, 0.0f);
    return;
  }
  for (int64_t c0 = 0; c0 < out; c0 += chunk_cols)
    column_chunk_gemms(dx, dw, dy + c0, ldy, x, w, n, in, c0, std::min(chunk_cols, out - c0));
}

void ce_backward_bf16_in_place(float* logits, const float* lse, const int32_t* targets, float dloss,
                               int64_t n, int64_t cols, int64_t real, int64_t v0) {
  if (device::on_cuda()) fail("ce_backward_bf16_in_place: the CPU only");
  if (n < 0 || cols < 1 || real > cols)
    fail("ce_backward_bf16_in_place: bad shape n={} cols={} real={}", n, cols, real);
  // A row is read and written through memcpy in chunks: the bf16 chunk c lands on bytes that
  // held f32 values of chunks c/2 and before, all read already, and memcpy's bytes alias the
  // floats (no type-based reordering of the reads after the writes).
  constexpr int64_t kChunk = 256;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    auto* row = reinterpret_cast<unsigned char*>(logits + i * cols);
    const float l = lse[i];
    const int64_t t = static_cast<int64_t>(targets[i]) - v0;
    const bool mine = t >= 0 && t < real;
    float xt = 0.0f;
    if (mine) std::memcpy(&xt, row + t * 4, 4);
    const float dt = (detail::fast_exp(xt - l) - 1.0f) * dloss;  // as the f32 kernels
    float in[kChunk];
    uint16_t o[kChunk];
    for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
      const int64_t m = std::min(kChunk, cols - c0);
      std::memcpy(in, row + c0 * 4, static_cast<size_t>(m) * 4);
      const int64_t valid = std::clamp<int64_t>(real - c0, 0, m);
#pragma omp simd
      for (int64_t k = 0; k < valid; ++k)
        o[k] = detail::bf16_bits(detail::fast_exp(in[k] - l) * dloss);
      for (int64_t k = valid; k < m; ++k) o[k] = 0;  // padding: +0
      if (mine && t >= c0 && t < c0 + m) o[t - c0] = detail::bf16_bits(dt);
      std::memcpy(row + c0 * 2, o, static_cast<size_t>(m) * 2);
    }
  }
}

}  // namespace mt::kernels

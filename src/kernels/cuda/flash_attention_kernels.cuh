// The device code of the fused causal attention (flash_attention.cu keeps the host side:
// the launches and the shape checks; attention.cu chooses the path). Flash-attention-2
// style, on bf16 tensor cores (WMMA 16x16x16, f32 accumulators); docs/cuda.md, "Fused
// attention".
//
// Tiles: 64 query rows x 64 keys; a block of 4 warps, warp w owns rows 16w..16w+15 of
// every 64-row tile it computes (scores, probabilities, outputs). q/k/v/dO tiles are read
// from the f32 tensors and rounded to bf16 into shared memory; every product accumulates in
// f32; the softmax is in f32. Rows at or past T are loaded as zeros and never written.
//
//  forward   one block per (b*h, query tile): K/V tiles 0..diagonal streamed through shared
//            memory, online softmax (running max m and sum l per row, O rescaled in shared
//            memory), out = O / l, lse = m + log l.
//  backward  1. one block per (b*h, query tile): O recomputed as sum_j exp(S_ij - lse_i) V_j
//               (the forward's loop without rescaling), D_i = sum_c dO_ic O_ic into scratch.
//            2. one block per (b*h, key tile): query tiles from the diagonal down; P and
//               dS = P * (dP - D) / sqrt(hd) recomputed; dV += P^T dO, dK += dS^T Q.
//            3. one block per (b*h, query tile): key tiles 0..diagonal; dQ += dS K.
//            Each output element is written once by one block: no atomics, deterministic.
//
// Two compilers read this header: nvcc (through flash_attention.cu) and the host C++ compiler
// under the CPU emulation of tests/kernels/cuda_emu/cuda_emu.h, which defines
// MT_CUDA_EMULATION and provides the CUDA names used here (threadIdx, __syncthreads,
// __shfl_xor_sync, __nv_bfloat16, nvcuda::wmma, ...) before including it; the kernels are the
// same text for both. The three hooks for the emulation are marked "Emulation hook".
#pragma once

// Emulation hook: the CUDA headers only under nvcc; the emulator provides their names.
#ifndef MT_CUDA_EMULATION
#include <cuda_bf16.h>
#include <mma.h>
#endif

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace mt::kernels::cuda::detail {
namespace {

// Emulation hook: the host has no per-block shared memory space, so the emulator defines the
// array that the kernels' block-scope `extern __shared__ ... smem[]` declarations name (a
// block-scope extern declaration refers to the enclosing namespace's variable).
// The kernels here declare only that `extern __shared__` array, and "extern static" is not
// C++: `__shared__` (the emulator's `static`, for block-scope arrays) is nothing down to the
// end of this header, where the last hook puts it back.
#ifdef MT_CUDA_EMULATION
MT_CUDA_EMU_DYNAMIC_SHARED(smem);
#pragma push_macro("__shared__")
#undef __shared__
#define __shared__
#endif

namespace wmma = nvcuda::wmma;
using bf16_t = __nv_bfloat16;
using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

constexpr int kTile = 64;   // query rows and keys per tile
constexpr int kWarps = 4;   // warp w owns rows 16w .. 16w+15 of a tile
constexpr int kFlashThreads = 32 * kWarps;
constexpr int kRowsPerWarp = kTile / kWarps;
constexpr int kLdS = kTile + 4;  // f32 [64][64] score tiles (ld a multiple of 4 floats)
constexpr int kLdP = kTile + 8;  // bf16 [64][64] probability tiles (ld a multiple of 8)
constexpr int kMaxTiles = 65535;  // query/key tiles on the grid's y axis
static_assert(kRowsPerWarp == 16, "one 16-row WMMA fragment row per warp");

// Shared-memory tiles of a head dim. Every size is a multiple of 128 bytes, so regions
// carved one after another from the (128-aligned) dynamic buffer keep the 32-byte alignment
// WMMA loads and stores need; every fragment pointer is a multiple of 16 rows and 16
// columns into its tile, which keeps it (16 * ld * elem and 16 * elem are multiples of 32).
template <int HD>
struct Dims {
  static constexpr int kLdH = HD + 8;  // bf16 [64][HD] tiles: q, k, v, dO
  static constexpr int kLdO = HD + 4;  // f32 [64][HD] tiles: O, the staging of dQ/dK/dV
  static constexpr size_t kHalfTile = size_t{kTile} * kLdH * sizeof(bf16_t);
  static constexpr size_t kScoreTile = size_t{kTile} * kLdS * sizeof(float);
  static constexpr size_t kProbTile = size_t{kTile} * kLdP * sizeof(bf16_t);
  static constexpr size_t kOutTile = size_t{kTile} * kLdO * sizeof(float);
  static constexpr size_t kRows = size_t{kTile} * sizeof(float);
  // S and dP, then (after the loop) the f32 staging of an output tile.
  static constexpr size_t kScoresAndStage =
      2 * kScoreTile > kOutTile ? 2 * kScoreTile : kOutTile;
  static_assert(kHalfTile % 128 == 0 && kScoreTile % 128 == 0 && kProbTile % 128 == 0 &&
                kOutTile % 128 == 0 && kRows % 128 == 0);
  static_assert(HD % 32 == 0, "lanes stride over the head dim");

  static constexpr size_t kForwardBytes = 3 * kHalfTile + kScoreTile + kProbTile + kOutTile;
  static constexpr size_t kKvBytes = 4 * kHalfTile + kScoresAndStage + 2 * kProbTile + 2 * kRows;
  static constexpr size_t kQBytes = 4 * kHalfTile + kScoresAndStage + kProbTile + 2 * kRows;
};

// Consecutive regions of the dynamic shared memory.
struct Carve {
  unsigned char* p;
  template <class T>
  __device__ T* take(size_t bytes) {
    T* r = reinterpret_cast<T*>(p);
    p += bytes;
    return r;
  }
};

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;  // the same bits in every lane (each step adds the same two values)
}
__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Rows row0 .. row0+63 of a [T, HD] head matrix (row stride ld floats) into a bf16 tile
// [64][kLdH]; rows at or past T become zeros. All threads of the block.
template <int HD>
__device__ void load_tile(bf16_t* dst, const float* src, int64_t ld, int row0, int T) {
  for (int i = static_cast<int>(threadIdx.x); i < kTile * HD; i += kFlashThreads) {
    const int r = i / HD, c = i % HD, t = row0 + r;
    const float x = t < T ? src[static_cast<int64_t>(t) * ld + c] : 0.0f;
    dst[r * Dims<HD>::kLdH + c] = __float2bfloat16_rn(x);
  }
}

// One warp: s[16][64] (f32, ld kLdS) = a[16][HD] * b[64][HD]^T, a and b bf16 tiles (ld kLdH),
// a at the warp's first row.
template <int HD>
__device__ void warp_scores(float* s, const bf16_t* a, const bf16_t* b) {
  constexpr int ld = Dims<HD>::kLdH;
#pragma unroll
  for (int n = 0; n < kTile / 16; ++n) {
    Acc acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int k = 0; k < HD / 16; ++k) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16_t, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16_t, wmma::col_major> fb;  // b^T
      wmma::load_matrix_sync(fa, a + k * 16, ld);
      wmma::load_matrix_sync(fb, b + n * 16 * ld + k * 16, ld);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(s + n * 16, acc, kLdS, wmma::mem_row_major);
  }
}

// One warp: acc (a [16][HD] f32 tile as HD/16 fragments) += A[16][64] * b[64][HD], b a bf16
// tile (ld kLdH). A is bf16 with ld kLdP: the rows at `a` (kTransA false), or the transpose
// of the [64][64] tile whose column block starts at `a` (kTransA true).
template <int HD, bool kTransA>
__device__ void warp_accumulate(Acc (&acc)[HD / 16], const bf16_t* a, const bf16_t* b) {
  using LayoutA = std::conditional_t<kTransA, wmma::col_major, wmma::row_major>;
  constexpr int ld = Dims<HD>::kLdH;
#pragma unroll
  for (int k = 0; k < kTile / 16; ++k) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16_t, LayoutA> fa;
    wmma::load_matrix_sync(fa, kTransA ? a + k * 16 * kLdP : a + k * 16, kLdP);
#pragma unroll
    for (int n = 0; n < HD / 16; ++n) {
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16_t, wmma::row_major> fb;
      wmma::load_matrix_sync(fb, b + k * 16 * ld + n * 16, ld);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

// The block's f32 fragments (warp w: rows 16w..) through `stage` ([64][kLdO]) to rows
// row0.. of dst (row stride ld floats), rows at or past T skipped. All threads.
template <int HD>
__device__ void write_tile(float* dst, int64_t ld, int row0, int T, const Acc (&acc)[HD / 16],
                           float* stage) {
  constexpr int ldo = Dims<HD>::kLdO;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  __syncthreads();  // stage (aliasing the score tiles) is no longer read
#pragma unroll
  for (int n = 0; n < HD / 16; ++n)
    wmma::store_matrix_sync(stage + warp * 16 * ldo + n * 16, acc[n], ldo, wmma::mem_row_major);
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < kTile * HD; i += kFlashThreads) {
    const int r = i / HD, c = i % HD, t = row0 + r;
    if (t < T) dst[static_cast<int64_t>(t) * ld + c] = stage[r * ldo + c];
  }
}

// The forward (kRecompute false: out and lse) or backward step 1 (kRecompute true: O again
// from lse, then d_rows = rowsum(dO * O)). Grid (B*NH, query tiles).
template <int HD, bool kRecompute>
__global__ void __launch_bounds__(kFlashThreads)
    flash_forward_kernel(float* out, float* lse_out, float* d_rows, const float* lse_in,
                         const float* dout, const float* qkv, int T, int NH, int64_t C,
                         float scale) {
  using D = Dims<HD>;
  extern __shared__ __align__(128) unsigned char smem[];
  Carve cv{smem};
  bf16_t* q_s = cv.take<bf16_t>(D::kHalfTile);
  bf16_t* k_s = cv.take<bf16_t>(D::kHalfTile);
  bf16_t* v_s = cv.take<bf16_t>(D::kHalfTile);
  float* s_s = cv.take<float>(D::kScoreTile);
  bf16_t* p_s = cv.take<bf16_t>(D::kProbTile);
  float* o_s = cv.take<float>(D::kOutTile);

  const int bh = static_cast<int>(blockIdx.x), b = bh / NH, h = bh % NH;
  const int tile = static_cast<int>(gridDim.y - 1 - blockIdx.y);  // the longest rows first
  const int q0 = tile * kTile;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t C3 = 3 * C;
  const float* q_g = qkv + static_cast<int64_t>(b) * T * C3 + static_cast<int64_t>(h) * HD;
  const float* k_g = q_g + C;
  const float* v_g = q_g + 2 * C;
  const int64_t row_base = static_cast<int64_t>(bh) * T;  // lse / d_rows index of row 0

  load_tile<HD>(q_s, q_g, C3, q0, T);
  for (int i = static_cast<int>(threadIdx.x); i < kTile * D::kLdO; i += kFlashThreads) o_s[i] = 0.0f;

  // The running max and sum of the warp's 16 rows, the same in every lane. When
  // recomputing, m is the stored lse and nothing is rescaled.
  float m[kRowsPerWarp], l[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int t = q0 + warp * kRowsPerWarp + r;
    if constexpr (kRecompute) {
      m[r] = t < T ? lse_in[row_base + t] : 0.0f;
    } else {
      m[r] = -INFINITY;
    }
    l[r] = 0.0f;
  }

  for (int kt = 0; kt <= tile; ++kt) {  // key tiles above the diagonal are skipped
    const int k0 = kt * kTile;
    __syncthreads();  // k_s, v_s, p_s of the previous tile are consumed (q_s, o_s stored)
    load_tile<HD>(k_s, k_g, C3, k0, T);
    load_tile<HD>(v_s, v_g, C3, k0, T);
    __syncthreads();
    warp_scores<HD>(s_s + warp * 16 * kLdS, q_s + warp * 16 * D::kLdH, k_s);
    __syncthreads();
    // Softmax of the warp's rows; lane holds keys k0 + lane and k0 + lane + 32.
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int row = warp * kRowsPerWarp + r, t = q0 + row;
      float x[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int c = lane + 32 * j, key = k0 + c;
        x[j] = key <= t && key < T ? s_s[row * kLdS + c] * scale : -INFINITY;
      }
      float p[2];
      if constexpr (kRecompute) {
        p[0] = expf(x[0] - m[r]);  // a masked key: exp(-inf) = 0
        p[1] = expf(x[1] - m[r]);
      } else {
        const float m_new = fmaxf(m[r], warp_max(fmaxf(x[0], x[1])));
        const float m_ref = m_new == -INFINITY ? 0.0f : m_new;  // a row with no key yet
        p[0] = expf(x[0] - m_ref);
        p[1] = expf(x[1] - m_ref);
        const float alpha = expf(m[r] - m_ref);  // 0 on the first tile (m = -inf)
        l[r] = l[r] * alpha + warp_sum(p[0] + p[1]);
        m[r] = m_new;
        for (int c = lane; c < HD; c += 32) o_s[row * D::kLdO + c] *= alpha;
      }
      p_s[row * kLdP + lane] = __float2bfloat16_rn(p[0]);
      p_s[row * kLdP + lane + 32] = __float2bfloat16_rn(p[1]);
    }
    __syncthreads();
    // O (the warp's rows) += P V.
    Acc acc[HD / 16];
#pragma unroll
    for (int n = 0; n < HD / 16; ++n)
      wmma::load_matrix_sync(acc[n], o_s + warp * 16 * D::kLdO + n * 16, D::kLdO,
                             wmma::mem_row_major);
    warp_accumulate<HD, false>(acc, p_s + warp * 16 * kLdP, v_s);
#pragma unroll
    for (int n = 0; n < HD / 16; ++n)
      wmma::store_matrix_sync(o_s + warp * 16 * D::kLdO + n * 16, acc[n], D::kLdO,
                              wmma::mem_row_major);
  }
  __syncthreads();

  // Each warp writes its own rows (warp-uniform skip of rows at or past T).
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int row = warp * kRowsPerWarp + r, t = q0 + row;
    if (t >= T) continue;
    const int64_t at = (static_cast<int64_t>(b) * T + t) * C + static_cast<int64_t>(h) * HD;
    if constexpr (kRecompute) {
      float d = 0.0f;
      // dO rounded to bf16 as in dP = dO V^T, so that D matches sum_j P_ij dP_ij more
      // closely (a host emulation of these kernels: dq/dk errors 4.1e-3 instead of 4.4e-3).
      for (int c = lane; c < HD; c += 32)
        d += __bfloat162float(__float2bfloat16_rn(dout[at + c])) * o_s[row * D::kLdO + c];
      d = warp_sum(d);
      if (lane == 0) d_rows[row_base + t] = d;
    } else {
      const float inv = 1.0f / l[r];
      for (int c = lane; c < HD; c += 32) out[at + c] = o_s[row * D::kLdO + c] * inv;
      if (lane == 0) lse_out[row_base + t] = m[r] + logf(l[r]);
    }
  }
}

// Backward step 2: dK and dV of one key tile. Grid (B*NH, key tiles).
template <int HD>
__global__ void __launch_bounds__(kFlashThreads)
    flash_backward_kv_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                             const float* d_rows, int T, int NH, int64_t C, float scale) {
  using D = Dims<HD>;
  extern __shared__ __align__(128) unsigned char smem[];
  Carve cv{smem};
  bf16_t* q_s = cv.take<bf16_t>(D::kHalfTile);
  bf16_t* do_s = cv.take<bf16_t>(D::kHalfTile);
  bf16_t* k_s = cv.take<bf16_t>(D::kHalfTile);
  bf16_t* v_s = cv.take<bf16_t>(D::kHalfTile);
  float* s_s = cv.take<float>(D::kScoresAndStage);  // S, then dP at s_s + kTile * kLdS
  float* dp_s = s_s + kTile * kLdS;
  bf16_t* p_s = cv.take<bf16_t>(D::kProbTile);
  bf16_t* ds_s = cv.take<bf16_t>(D::kProbTile);
  float* lse_s = cv.take<float>(D::kRows);
  float* d_s = cv.take<float>(D::kRows);

  const int bh = static_cast<int>(blockIdx.x), b = bh / NH, h = bh % NH;
  const int kt = static_cast<int>(blockIdx.y), k0 = kt * kTile;
  const int n_tiles = static_cast<int>(gridDim.y);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t C3 = 3 * C;
  const float* q_g = qkv + static_cast<int64_t>(b) * T * C3 + static_cast<int64_t>(h) * HD;
  const float* do_g = dout + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * HD;
  const int64_t row_base = static_cast<int64_t>(bh) * T;

  load_tile<HD>(k_s, q_g + C, C3, k0, T);
  load_tile<HD>(v_s, q_g + 2 * C, C3, k0, T);
  Acc dk[HD / 16], dv[HD / 16];
#pragma unroll
  for (int n = 0; n < HD / 16; ++n) {
    wmma::fill_fragment(dk[n], 0.0f);
    wmma::fill_fragment(dv[n], 0.0f);
  }

  for (int qt = kt; qt < n_tiles; ++qt) {  // query tiles at or below the diagonal
    const int q0 = qt * kTile;
    __syncthreads();  // q_s, do_s, p_s, ds_s, lse_s, d_s of the previous tile are consumed
    load_tile<HD>(q_s, q_g, C3, q0, T);
    load_tile<HD>(do_s, do_g, C, q0, T);
    for (int i = static_cast<int>(threadIdx.x); i < kTile; i += kFlashThreads) {
      const int t = q0 + i;
      lse_s[i] = t < T ? lse[row_base + t] : 0.0f;
      d_s[i] = t < T ? d_rows[row_base + t] : 0.0f;
    }
    __syncthreads();
    // Rows = queries: S = Q K^T, dP = dO V^T.
    warp_scores<HD>(s_s + warp * 16 * kLdS, q_s + warp * 16 * D::kLdH, k_s);
    warp_scores<HD>(dp_s + warp * 16 * kLdS, do_s + warp * 16 * D::kLdH, v_s);
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int row = warp * kRowsPerWarp + r, t = q0 + row;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int c = lane + 32 * j, key = k0 + c;
        const bool valid = t < T && key <= t;  // key <= t < T
        const float p = valid ? expf(s_s[row * kLdS + c] * scale - lse_s[row]) : 0.0f;
        const float ds = valid ? p * (dp_s[row * kLdS + c] - d_s[row]) * scale : 0.0f;
        p_s[row * kLdP + c] = __float2bfloat16_rn(p);
        ds_s[row * kLdP + c] = __float2bfloat16_rn(ds);
      }
    }
    __syncthreads();
    // Rows = keys (warp w: keys k0 + 16w ..): dV += P^T dO, dK += dS^T Q.
    warp_accumulate<HD, true>(dv, p_s + warp * 16, do_s);
    warp_accumulate<HD, true>(dk, ds_s + warp * 16, q_s);
  }

  float* dq_g = dqkv + static_cast<int64_t>(b) * T * C3 + static_cast<int64_t>(h) * HD;
  write_tile<HD>(dq_g + C, C3, k0, T, dk, s_s);
  write_tile<HD>(dq_g + 2 * C, C3, k0, T, dv, s_s);
}

// Backward step 3: dQ of one query tile. Grid (B*NH, query tiles).
template <int HD>
__global__ void __launch_bounds__(kFlashThreads)
    flash_backward_q_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                            const float* d_rows, int T, int NH, int64_t C, float scale) {
  using D = Dims<HD>;
  extern __shared__ __align__(128) unsigned char smem[];
  Carve cv{smem};
  bf16_t* q_s = cv.take<bf16_t>(D::kHalfTile);
  bf16_t* do_s = cv.take<bf16_t>(D::kHalfTile);
  bf16_t* k_s = cv.take<bf16_t>(D::kHalfTile);
  bf16_t* v_s = cv.take<bf16_t>(D::kHalfTile);
  float* s_s = cv.take<float>(D::kScoresAndStage);
  float* dp_s = s_s + kTile * kLdS;
  bf16_t* ds_s = cv.take<bf16_t>(D::kProbTile);
  float* lse_s = cv.take<float>(D::kRows);
  float* d_s = cv.take<float>(D::kRows);

  const int bh = static_cast<int>(blockIdx.x), b = bh / NH, h = bh % NH;
  const int tile = static_cast<int>(gridDim.y - 1 - blockIdx.y);  // the longest rows first
  const int q0 = tile * kTile;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t C3 = 3 * C;
  const float* q_g = qkv + static_cast<int64_t>(b) * T * C3 + static_cast<int64_t>(h) * HD;
  const float* do_g = dout + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * HD;
  const int64_t row_base = static_cast<int64_t>(bh) * T;

  load_tile<HD>(q_s, q_g, C3, q0, T);
  load_tile<HD>(do_s, do_g, C, q0, T);
  for (int i = static_cast<int>(threadIdx.x); i < kTile; i += kFlashThreads) {
    const int t = q0 + i;
    lse_s[i] = t < T ? lse[row_base + t] : 0.0f;
    d_s[i] = t < T ? d_rows[row_base + t] : 0.0f;
  }
  Acc dq[HD / 16];
#pragma unroll
  for (int n = 0; n < HD / 16; ++n) wmma::fill_fragment(dq[n], 0.0f);

  for (int kt = 0; kt <= tile; ++kt) {  // key tiles above the diagonal are skipped
    const int k0 = kt * kTile;
    __syncthreads();  // k_s, v_s, ds_s of the previous tile are consumed (q_s.. stored)
    load_tile<HD>(k_s, q_g + C, C3, k0, T);
    load_tile<HD>(v_s, q_g + 2 * C, C3, k0, T);
    __syncthreads();
    warp_scores<HD>(s_s + warp * 16 * kLdS, q_s + warp * 16 * D::kLdH, k_s);
    warp_scores<HD>(dp_s + warp * 16 * kLdS, do_s + warp * 16 * D::kLdH, v_s);
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int row = warp * kRowsPerWarp + r, t = q0 + row;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int c = lane + 32 * j, key = k0 + c;
        const bool valid = t < T && key <= t;
        const float p = valid ? expf(s_s[row * kLdS + c] * scale - lse_s[row]) : 0.0f;
        const float ds = valid ? p * (dp_s[row * kLdS + c] - d_s[row]) * scale : 0.0f;
        ds_s[row * kLdP + c] = __float2bfloat16_rn(ds);
      }
    }
    __syncthreads();
    // Rows = queries (warp w: its 16 rows): dQ += dS K.
    warp_accumulate<HD, false>(dq, ds_s + warp * 16 * kLdP, k_s);
  }

  write_tile<HD>(dqkv + static_cast<int64_t>(b) * T * C3 + static_cast<int64_t>(h) * HD, C3, q0,
                 T, dq, s_s);
}

}  // namespace
}  // namespace mt::kernels::cuda::detail

// Emulation hook: the emulator's `__shared__` again, for the headers after this one.
#ifdef MT_CUDA_EMULATION
#pragma pop_macro("__shared__")
#endif

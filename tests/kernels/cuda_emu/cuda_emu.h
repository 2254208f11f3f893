// A host emulation of the CUDA subset the fused attention kernels use
// (src/kernels/cuda/flash_attention_kernels.cuh), so that a test without a GPU or nvcc runs
// their real source: tests/kernels/flash_emulated_test.cpp. Include this header after the
// standard headers, then the kernels' header; it defines MT_CUDA_EMULATION, which makes that
// header take the CUDA names from here instead of <cuda_bf16.h> and <mma.h>.
//
// What it models
// * launch(kernel, grid, threads, shared_bytes, args...), for kernel<<<grid, threads,
//   shared_bytes>>>(args...): the blocks run one after another (x fastest, then y, then z);
//   the threads of a block are std::threads (created once per launch and reused from block to
//   block), each with its own threadIdx, blockIdx, blockDim and gridDim.
// * __syncthreads: a std::barrier of the block's threads. A thread that returns leaves the
//   barrier, and after each block the launch checks that every thread passed the same number
//   of barriers: a __syncthreads under a divergent branch is reported, not a hang.
// * Warps: 32 consecutive threads. __shfl_xor_sync (full mask, width 32) exchanges the values
//   through a per-warp buffer and a barrier of the warp's 32 threads; every lane of a warp must
//   make the same number of shuffles (checked like the barriers).
// * Dynamic shared memory: one 227 KiB array (an H100's per-block opt-in maximum; a launch
//   asking for more is refused) that the kernels' `extern __shared__` names (the kernels'
//   header declares it with MT_CUDA_EMU_DYNAMIC_SHARED). Before each block, its first
//   shared_bytes are filled with 0xff bytes, a NaN as f32 and as bf16, so that reading a word
//   the block has not written shows up as NaN in the results; under ASan the rest is
//   poisoned, so any access past the launch's shared_bytes is reported.
// * __nv_bfloat16: round-to-nearest-even __float2bfloat16_rn and the exact __bfloat162float.
// * nvcuda::wmma, the 16x16x16 shape with bf16 matrix_a / matrix_b and f32 accumulators: lane
//   0 of a warp does the warp's whole load, store and mma (f32 sums, k ascending; a product of
//   two bf16 values is exact in f32); the other lanes' fragments are unused. Every load and
//   store checks CUDA's rules, a 32-byte aligned pointer and ldm a multiple of 16 bytes, and
//   that the 16 rows lie inside the launch's dynamic shared memory (these kernels keep every
//   WMMA operand there; the emulator accepts nothing else).
// * __global__, __device__, __forceinline__, __launch_bounds__, __align__, __shared__: nothing
//   (the alignment comes from the shared array's definition). expf, logf, fmaxf and INFINITY
//   are the host's <cmath>.
// Misuse (a bad WMMA pointer, too much shared memory, a mismatched barrier count) aborts with
// a message that starts "cuda_emu:".
//
// What it does not model
// * Memory ordering beyond the barriers: shared memory is plain host memory, and a missing
//   __syncthreads shows up only when the schedule happens to expose it (the results go wrong
//   or the NaN fill leaks through). Under TSan (make sanitize) every unsynchronized pair of
//   accesses from two threads is reported, whatever the schedule. Lanes are not in lockstep:
//   code relying on implicit warp synchrony (no __syncwarp) is a race here, as on Volta and
//   later.
// * The tensor cores' arithmetic and fragment layouts: real WMMA sums in another order, and
//   each lane holds a part of a fragment; code that reads fragment elements per lane does not
//   compile here (fragments have no `x`). That all lanes pass the same WMMA arguments is not
//   checked.
// * Anything between blocks (they never run concurrently: no atomics, no grid sync), memory
//   spaces (global memory is the host's: bounds are the test's to check), warp
//   divergence costs, bank conflicts, occupancy, registers, timing, the host runtime
//   (cudaFuncSetAttribute, streams, launch errors).
#pragma once

#define MT_CUDA_EMULATION 1

#include <barrier>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define MT_CUDA_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MT_CUDA_EMU_ASAN 1
#endif
#endif
#ifdef MT_CUDA_EMU_ASAN
#include <sanitizer/asan_interface.h>
#endif

// ---- CUDA qualifiers: nothing on the host -------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__
#define __align__(n)
#define __launch_bounds__(...)

namespace mt::cuda_emu {

struct Uint3 {  // CUDA's uint3 (threadIdx, blockIdx)
  unsigned x = 0, y = 0, z = 0;
};
struct Dim3 {  // CUDA's dim3 (blockDim, gridDim, launch sizes)
  unsigned x = 1, y = 1, z = 1;
};

constexpr unsigned kWarpSize = 32;
constexpr unsigned kMaxBlockThreads = 1024;
constexpr size_t kMaxDynamicSharedBytes = size_t{227} * 1024;  // H100 opt-in, per block

[[noreturn]] inline void fail(const char* what, long long a = 0, long long b = 0) {
  std::fprintf(stderr, "cuda_emu: %s (%lld, %lld)\n", what, a, b);
  std::fflush(stderr);
  std::abort();
}

// The dynamic shared memory array, defined by MT_CUDA_EMU_DYNAMIC_SHARED in the kernels'
// header (during static initialization, before any launch).
inline unsigned char* g_dynamic_shared = nullptr;
inline bool register_dynamic_shared(unsigned char* p) {
  if (g_dynamic_shared && g_dynamic_shared != p)
    fail("two MT_CUDA_EMU_DYNAMIC_SHARED arrays in one program (one kernels' header only)");
  g_dynamic_shared = p;
  return true;
}

namespace detail {

// What the threads of a running launch share.
struct Launch {
  unsigned threads = 0, warps = 0;
  size_t shared_bytes = 0;
  std::unique_ptr<std::barrier<>> block_barrier;               // this block's __syncthreads
  std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;  // this block's shuffles
  std::vector<float> shuffle;             // [warp][2 (alternate shuffles)][32 lanes]
  std::vector<unsigned> syncs, shuffles;  // per thread, counted over the block
};

inline thread_local Launch* t_launch = nullptr;
inline thread_local unsigned t_syncs = 0, t_shuffles = 0;

inline Launch& launch_state() {
  if (!t_launch) fail("a CUDA device function called outside cuda_emu::launch");
  return *t_launch;
}

// Bytes [p, p + extent) inside the launch's dynamic shared memory.
inline void check_shared(const void* p, size_t extent) {
  const auto* c = static_cast<const unsigned char*>(p);
  const unsigned char* base = g_dynamic_shared;
  const size_t bytes = launch_state().shared_bytes;
  if (!base || c < base || c + extent > base + bytes)
    fail("WMMA operand outside the launch's dynamic shared memory (byte offset, extent)",
         base ? static_cast<long long>(c - base) : -1, static_cast<long long>(extent));
}

}  // namespace detail
}  // namespace mt::cuda_emu

// ---- built-in variables and intrinsics (global names, as in CUDA) -------------------------
inline thread_local mt::cuda_emu::Uint3 threadIdx, blockIdx;
inline thread_local mt::cuda_emu::Dim3 blockDim, gridDim;

inline void __syncthreads() {
  auto& l = mt::cuda_emu::detail::launch_state();
  ++mt::cuda_emu::detail::t_syncs;
  l.block_barrier->arrive_and_wait();
}

// One barrier per shuffle: consecutive shuffles use alternate halves of the warp's buffer, and
// a lane writes a half again only after the barrier of the shuffle in between, which every
// lane reaches only after reading the half.
inline float __shfl_xor_sync(unsigned mask, float v, int lane_mask, int width = 32) {
  namespace d = mt::cuda_emu::detail;
  if (mask != 0xffffffffu || width != 32 || lane_mask < 0 || lane_mask >= 32)
    mt::cuda_emu::fail(
        "__shfl_xor_sync: only the full mask, width 32 and lane_mask 0..31 (mask, lane_mask)",
        static_cast<long long>(mask), lane_mask);
  auto& l = d::launch_state();
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* half = l.shuffle.data() + (warp * 2 + (d::t_shuffles & 1u)) * 32;
  half[lane] = v;
  ++d::t_shuffles;
  l.warp_barriers[warp]->arrive_and_wait();
  return half[lane ^ static_cast<unsigned>(lane_mask)];
}

// ---- bf16 -----------------------------------------------------------------------------------
struct __nv_bfloat16 {
  std::uint16_t bits;
};
static_assert(sizeof(__nv_bfloat16) == 2);

inline __nv_bfloat16 __float2bfloat16_rn(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u)  // NaN: keep it a (quiet) NaN
    return {static_cast<std::uint16_t>((u >> 16) | 0x40u)};
  return {static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};  // to even
}

inline float __bfloat162float(__nv_bfloat16 h) {
  const std::uint32_t u = static_cast<std::uint32_t>(h.bits) << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// ---- WMMA: lane 0 does the warp's work --------------------------------------------------------
namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "cuda_emu: the 16x16x16 shape only");
  static_assert(std::is_same_v<Use, accumulator> ? std::is_same_v<T, float>
                                                 : std::is_same_v<T, __nv_bfloat16>,
                "cuda_emu: bf16 matrix_a / matrix_b and f32 accumulators only");
  float emu_tile[16][16];  // lane 0's copy: the whole tile, element (row, col)
};

namespace emu {

using mt::cuda_emu::fail;

inline bool lane0() { return threadIdx.x % 32 == 0; }

// A 16x16 tile at p with leading dimension ldm (elements of T): CUDA's alignment and ldm
// rules, and the emulator's shared-memory bounds.
template <class T>
void check_tile(const T* p, unsigned ldm) {
  if (reinterpret_cast<std::uintptr_t>(p) % 32 != 0)
    fail("WMMA pointer not 32-byte aligned (address mod 32, ldm)",
         static_cast<long long>(reinterpret_cast<std::uintptr_t>(p) % 32), ldm);
  if (ldm < 16 || ldm * sizeof(T) % 16 != 0)
    fail("WMMA ldm is not a multiple of 16 bytes of at least 16 elements (ldm, element bytes)", ldm,
         static_cast<long long>(sizeof(T)));
  mt::cuda_emu::detail::check_shared(p, (size_t{15} * ldm + 16) * sizeof(T));
}

inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
inline float to_float(float x) { return x; }

template <class T>
void load(float (&tile)[16][16], const T* p, unsigned ldm, bool row_major) {
  check_tile(p, ldm);
  for (unsigned r = 0; r < 16; ++r)
    for (unsigned c = 0; c < 16; ++c)
      tile[r][c] = to_float(row_major ? p[r * ldm + c] : p[c * ldm + r]);
}

}  // namespace emu

template <class Use, class Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, __nv_bfloat16, Layout>& f, const __nv_bfloat16* p,
                      unsigned ldm) {
  static_assert(std::is_same_v<Layout, row_major> || std::is_same_v<Layout, col_major>);
  if (emu::lane0()) emu::load(f.emu_tile, p, ldm, std::is_same_v<Layout, row_major>);
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p,
                             unsigned ldm, layout_t layout) {
  if (emu::lane0()) emu::load(f.emu_tile, p, ldm, layout == mem_row_major);
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f,
                              unsigned ldm, layout_t layout) {
  if (!emu::lane0()) return;
  emu::check_tile(p, ldm);
  for (unsigned r = 0; r < 16; ++r)
    for (unsigned c = 0; c < 16; ++c)
      (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.emu_tile[r][c];
}

inline void fill_fragment(fragment<accumulator, 16, 16, 16, float>& f, float v) {
  for (auto& row : f.emu_tile)
    for (float& x : row) x = v;
}

// d = a b + c (d may be c).
template <class LayoutA, class LayoutB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
              const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LayoutA>& a,
              const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LayoutB>& b,
              const fragment<accumulator, 16, 16, 16, float>& c) {
  if (!emu::lane0()) return;
  float t[16][16];
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      float s = c.emu_tile[i][j];
      for (int k = 0; k < 16; ++k) s += a.emu_tile[i][k] * b.emu_tile[k][j];
      t[i][j] = s;
    }
  std::memcpy(d.emu_tile, t, sizeof t);
}

}  // namespace nvcuda::wmma

// Defines the dynamic shared memory array `name` in the kernels' namespace (see the top).
#define MT_CUDA_EMU_DYNAMIC_SHARED(name)                                   \
  alignas(128) unsigned char name[::mt::cuda_emu::kMaxDynamicSharedBytes]; \
  [[maybe_unused]] const bool name##_emu_registered = ::mt::cuda_emu::register_dynamic_shared(name)

namespace mt::cuda_emu {

// kernel<<<grid, threads, shared_bytes>>>(args...) on this CPU; returns when it is done.
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), Dim3 grid, unsigned threads, size_t shared_bytes,
            Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "the kernel's argument count");
  if (threads == 0 || threads > kMaxBlockThreads || threads % kWarpSize != 0)
    fail("launch: threads per block must be a multiple of 32 up to 1024 (threads)", threads);
  if (shared_bytes > kMaxDynamicSharedBytes)
    fail("launch: more dynamic shared memory than a block can have (bytes, limit)",
         static_cast<long long>(shared_bytes), static_cast<long long>(kMaxDynamicSharedBytes));
  if (shared_bytes > 0 && !g_dynamic_shared)
    fail("launch: shared memory asked for, but no MT_CUDA_EMU_DYNAMIC_SHARED array");
  const unsigned long long n_blocks = 1ull * grid.x * grid.y * grid.z;
  if (n_blocks == 0) return;

  const std::tuple<Params...> params(std::forward<Args>(args)...);
  detail::Launch l;
  l.threads = threads;
  l.warps = threads / kWarpSize;
  l.shared_bytes = shared_bytes;
  l.shuffle.assign(size_t{l.warps} * 2 * kWarpSize, 0.0f);
  l.syncs.assign(threads, 0);
  l.shuffles.assign(threads, 0);
#ifdef MT_CUDA_EMU_ASAN
  if (g_dynamic_shared)
    ASAN_POISON_MEMORY_REGION(g_dynamic_shared + shared_bytes,
                              kMaxDynamicSharedBytes - shared_bytes);
#endif

  // Runs, with every thread of the launch stopped, between two blocks: checks the block that
  // ended (if any) and sets up the next (if any).
  unsigned long long between_calls = 0;
  auto between = [&]() noexcept {
    if (between_calls > 0) {
      for (unsigned t = 0; t < threads; ++t) {
        if (l.syncs[t] != l.syncs[0])
          fail("threads of a block passed different numbers of __syncthreads (thread, count)", t,
               l.syncs[t]);
        if (l.shuffles[t] != l.shuffles[t / kWarpSize * kWarpSize])
          fail("lanes of a warp made different numbers of shuffles (thread, count)", t,
               l.shuffles[t]);
      }
    }
    if (between_calls < n_blocks) {
      if (shared_bytes > 0) std::memset(g_dynamic_shared, 0xff, shared_bytes);  // NaN
      l.block_barrier = std::make_unique<std::barrier<>>(threads);
      l.warp_barriers.clear();
      for (unsigned w = 0; w < l.warps; ++w)
        l.warp_barriers.push_back(std::make_unique<std::barrier<>>(kWarpSize));
    }
    ++between_calls;
  };
  std::barrier<decltype(between)> between_blocks(threads, between);

  auto body = [&](unsigned tid) {
    detail::t_launch = &l;
    threadIdx = {tid, 0, 0};
    blockDim = {threads, 1, 1};
    gridDim = grid;
    for (unsigned long long b = 0; b < n_blocks; ++b) {
      between_blocks.arrive_and_wait();
      blockIdx = {static_cast<unsigned>(b % grid.x), static_cast<unsigned>(b / grid.x % grid.y),
                  static_cast<unsigned>(b / grid.x / grid.y)};
      detail::t_syncs = 0;
      detail::t_shuffles = 0;
      std::apply(kernel, params);
      l.syncs[tid] = detail::t_syncs;
      l.shuffles[tid] = detail::t_shuffles;
      // Returned: out of the block's barriers (the others may still wait at one).
      l.warp_barriers[tid / kWarpSize]->arrive_and_drop();
      l.block_barrier->arrive_and_drop();
    }
    between_blocks.arrive_and_wait();  // the last block's check
    detail::t_launch = nullptr;
  };
  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (unsigned t = 0; t < threads; ++t) pool.emplace_back(body, t);
  for (auto& t : pool) t.join();

#ifdef MT_CUDA_EMU_ASAN
  if (g_dynamic_shared) ASAN_UNPOISON_MEMORY_REGION(g_dynamic_shared, kMaxDynamicSharedBytes);
#endif
}

}  // namespace mt::cuda_emu

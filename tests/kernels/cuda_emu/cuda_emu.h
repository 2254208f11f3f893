// A host emulation of the CUDA subset that the custom kernels use, so that a test without a
// GPU or nvcc runs their real source: the fused attention (src/kernels/cuda/
// flash_attention_kernels.cuh, tests/kernels/flash_emulated_test.cpp) and the other kernels'
// device code (src/kernels/cuda/*_kernels.cuh and device_util.cuh,
// tests/kernels/cuda_emulated_test.cpp). Include this header after the standard headers, then
// the kernels' headers; it defines MT_CUDA_EMULATION, which makes those headers take the CUDA
// names from here instead of <cuda_runtime.h>, <cuda_bf16.h> and <mma.h>.
//
// What it models
// * launch(kernel, grid, threads, shared_bytes, args...), for kernel<<<grid, threads,
//   shared_bytes>>>(args...): the blocks run one after another (x fastest, then y, then z),
//   on the calling thread. The threads of a block are fibers (ucontext: makecontext and
//   swapcontext, a 256 KiB stack each above a 64 KiB guard, created once and reused by every
//   block and launch), each with its own threadIdx, blockIdx, blockDim and gridDim (grid.y and
//   grid.z included; blocks are one-dimensional: threadIdx.y and .z are 0; the globals hold the
//   running fiber's). Any block size that is a multiple of 32 up to 1024.
// * Scheduling: round robin in threadIdx order. A thread runs until it reaches a
//   __syncthreads, a shuffle or its return, then the next runnable thread runs; a barrier (a
//   shuffle) lets its threads go on once every thread of the block (lane of the warp) has
//   arrived. So thread 0 runs each section between two barriers whole before thread 1 starts
//   it: a read of a value that another thread writes in the same section (a missing
//   __syncthreads) sees the NaN fill below or the previous section's data, and the results
//   go wrong. The schedule is the same on every run. The fibers switch to one another; the
//   launching thread only starts thread 0 of each block and gets control back when the last
//   thread returns. A switch costs one system call (swapcontext sets the signal mask).
// * __syncthreads: every thread of the block must pass the same number. A thread that returns
//   while another waits at a barrier, or a barrier reached after a thread returned, is
//   reported, as are threads waiting at a barrier while others wait at a shuffle: a
//   __syncthreads under a divergent branch is reported, not a hang.
// * Warps: 32 consecutive threads. __shfl_xor_sync (full mask, width 32) exchanges the values
//   through a per-warp buffer once all 32 lanes have arrived; every lane of a warp must make
//   the same number of shuffles (checked like the barriers).
// * Sanitizers: the fiber switches are annotated for ASan (its stack bookkeeping) and TSan.
//   Under TSan each thread of a block is a TSan fiber and a switch is no synchronization; the
//   happens-before of a barrier (of a shuffle: among the warp's lanes), and of the end of a
//   block before the next one, is declared explicitly, so TSan reports every pair of accesses
//   from two threads of a block that no barrier orders, as it would for threads. The
//   emulator's own bookkeeping is hidden from TSan. (__nv_bfloat16's copies are spelled out:
//   GCC's TSan does not see the copy of a 2-byte struct, so races on bf16 tiles went unseen.)
// * Static shared memory: `__shared__` is `static`, so a block-scope `__shared__ float
//   shm[256];` is one array per kernel (per template instantiation), which every thread of the
//   block sees, as on a GPU. That is CUDA's meaning because the blocks of a launch run one
//   after another and launches one at a time (launch returns when its kernel is done; two host
//   threads must not launch at once: the fibers, the static arrays and the dynamic one below
//   are shared between their blocks). Unlike the dynamic memory these arrays are not refilled
//   between blocks: they start as zeros and keep what the previous block (or launch) left, so
//   a read before the block's own write is not caught by a NaN here (TSan still sees a read
//   racing with another thread's write). A header whose kernels declare `extern __shared__`
//   arrays makes `__shared__` nothing around them ("extern static" is not C++), as
//   flash_attention_kernels.cuh does with #pragma push_macro / pop_macro.
// * Dynamic shared memory: one 227 KiB array (an H100's per-block opt-in maximum; a launch
//   asking for more is refused) that the kernels' `extern __shared__` names (the kernels'
//   header declares it with MT_CUDA_EMU_DYNAMIC_SHARED). Before each block, its first
//   shared_bytes are filled with 0xff bytes, a NaN as f32 and as bf16, so that reading a word
//   the block has not written shows up as NaN in the results; under ASan the rest is
//   poisoned, so any access past the launch's shared_bytes is reported.
// * __nv_bfloat16: round-to-nearest-even __float2bfloat16_rn and the exact __bfloat162float.
// * __float_as_uint / __uint_as_float (the bits, by memcpy) and the IEEE single-operation
//   intrinsics __fadd_rn, __fsub_rn, __fmul_rn, __fdiv_rn: exact host f32 arithmetic, one
//   rounding each (never contracted into an FMA: the host build is ISO C++, where GCC does not
//   contract, and each is a separate statement).
// * nvcuda::wmma, the 16x16x16 shape with bf16 matrix_a / matrix_b and f32 accumulators: lane
//   0 of a warp does the warp's whole load, store and mma (f32 sums, k ascending; a product of
//   two bf16 values is exact in f32); the other lanes' fragments are unused. Every load and
//   store checks CUDA's rules, a 32-byte aligned pointer and ldm a multiple of 16 bytes, and
//   that the 16 rows lie inside the launch's dynamic shared memory (these kernels keep every
//   WMMA operand there; the emulator accepts nothing else).
// * __global__, __device__, __host__, __forceinline__, __launch_bounds__, __align__: nothing
//   (the alignment of the dynamic array comes from its definition). expf, logf, sqrtf, fmaxf,
//   NAN and INFINITY are the host's <cmath>: glibc's expf / logf are correctly rounded or
//   within an ulp, as CUDA's expf (2 ulp) and logf (1 ulp) are not bit for bit; sqrtf and
//   fmaxf are exact on both.
// Misuse (a bad WMMA pointer, too much shared memory, a mismatched barrier or shuffle count,
// a launch from inside a kernel) aborts with a message that starts "cuda_emu:".
//
// What it does not model
// * Memory ordering beyond the barriers, and any other interleaving than the round robin:
//   shared memory is plain host memory, and without a sanitizer a missing __syncthreads shows
//   up only through the results (wrong, or the NaN fill leaking through; a race whose two
//   sides the round robin happens to order as intended goes unseen). Under TSan (make
//   sanitize) every unsynchronized pair of accesses from two threads is reported, whatever
//   the schedule. Lanes are not in lockstep: code relying on implicit warp synchrony (no
//   __syncwarp) is a race here, as on Volta and later.
// * The tensor cores' arithmetic and fragment layouts: real WMMA sums in another order, and
//   each lane holds a part of a fragment; code that reads fragment elements per lane does not
//   compile here (fragments have no `x`). That all lanes pass the same WMMA arguments is not
//   checked.
// * The GPU's math library bit for bit (expf, logf: see above), nvcc's FMA contraction of
//   plain `a * b + c` (the host never contracts; the GPU may, so a kernel's plain f32
//   expressions can differ from the GPU's in the last bits).
// * Anything between blocks (they never run concurrently: no atomics, no grid sync, and a
//   race between two blocks writing the same element goes unseen), memory spaces (global
//   memory is the host's: bounds are the test's to check), warp divergence costs, bank
//   conflicts, occupancy, registers, timing, the host runtime (cudaFuncSetAttribute, streams,
//   launch errors, grid limits such as 65535 blocks on y and z). A thread's stack is 256 KiB:
//   a kernel's locals must fit (an overflow of up to 64 KiB faults on the guard; a single
//   larger frame could jump past it).
#pragma once

#define MT_CUDA_EMULATION 1

#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
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
#include <sanitizer/common_interface_defs.h>
#endif

#if defined(__SANITIZE_THREAD__)
#define MT_CUDA_EMU_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define MT_CUDA_EMU_TSAN 1
#endif
#endif
#ifdef MT_CUDA_EMU_TSAN
#include <sanitizer/tsan_interface.h>
// In the TSan runtime (tsan_interface_ann.cpp) but not in its public header: accesses of the
// calling thread (here: fiber) are not recorded until the matching end.
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();
#endif

// ---- CUDA qualifiers: nothing on the host -------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static  // see "Static shared memory" at the top
#define __align__(n)
#define __launch_bounds__(...)

namespace mt::cuda_emu {

struct Uint3 {  // CUDA's uint3 (threadIdx, blockIdx)
  unsigned x = 0, y = 0, z = 0;
};
struct Dim3 {  // CUDA's dim3 (blockDim, gridDim, launch sizes)
  unsigned x = 1, y = 1, z = 1;
};
}  // namespace mt::cuda_emu

// ---- built-in variables (global names, as in CUDA): the running fiber's ---------------------
inline mt::cuda_emu::Uint3 threadIdx, blockIdx;
inline mt::cuda_emu::Dim3 blockDim, gridDim;

namespace mt::cuda_emu {

constexpr unsigned kWarpSize = 32;
constexpr unsigned kMaxBlockThreads = 1024;
constexpr unsigned kMaxWarps = kMaxBlockThreads / kWarpSize;
constexpr size_t kMaxDynamicSharedBytes = size_t{227} * 1024;  // H100 opt-in, per block
constexpr size_t kFiberStackBytes = size_t{256} * 1024;        // per emulated thread

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

// ---- sanitizer hooks: nothing without the sanitizer ----------------------------------------
// TSan: `ignore` hides the emulator's bookkeeping (the scheduler's writes of threadIdx, the
// fibers' states), `release` / `acquire` on a sync word declare a happens-before.
inline void tsan_ignore_begin() {
#ifdef MT_CUDA_EMU_TSAN
  __tsan_ignore_thread_begin();
#endif
}
inline void tsan_ignore_end() {
#ifdef MT_CUDA_EMU_TSAN
  __tsan_ignore_thread_end();
#endif
}
inline void tsan_release([[maybe_unused]] void* word) {
#ifdef MT_CUDA_EMU_TSAN
  __tsan_release(word);
#endif
}
inline void tsan_acquire([[maybe_unused]] void* word) {
#ifdef MT_CUDA_EMU_TSAN
  __tsan_acquire(word);
#endif
}

enum class State : unsigned char { kRunnable, kAtBarrier, kAtShuffle, kReturned };

// One emulated thread: its context, its stack (above a guard) and its counts in the running
// block.
struct Fiber {
  ucontext_t context{};
  unsigned char* mapping = nullptr;  // the guard, then the stack
  unsigned tid = 0;
  State state = State::kReturned;
  unsigned syncs = 0, shuffles = 0;
  void* asan_fake_stack = nullptr;  // ASan's fake stack while switched out
  void* tsan_fiber = nullptr;
};

constexpr size_t kGuardBytes = size_t{64} * 1024;  // below each stack, no access

// The fibers (kept from launch to launch) and the running launch's block.
struct Engine {
  std::vector<std::unique_ptr<Fiber>> fibers;  // thread t of every block is fibers[t]
  ucontext_t scheduler{};                      // the launching thread, while a fiber runs
  const void* scheduler_stack = nullptr;       // its stack, for ASan
  size_t scheduler_stack_bytes = 0;
  bool from_scheduler = false;  // the switch under way is from the scheduler
  void* tsan_scheduler = nullptr;

  bool launching = false;
  void (*body)(const void*) = nullptr;  // runs the kernel with the launch's arguments
  const void* call = nullptr;
  unsigned threads = 0;
  size_t shared_bytes = 0;
  Fiber* current = nullptr;  // the running fiber, null outside a launch's block
  unsigned running = 0, returned = 0, at_barrier = 0;
  unsigned at_shuffle[kMaxWarps] = {};
  float shuffle[kMaxWarps][2][kWarpSize] = {};  // alternate shuffles use alternate halves
  // TSan sync words (only their addresses matter): barrier and shuffle ones alternate like
  // the shuffle buffer, so a thread that went on past a barrier, and reached the next one,
  // does not release into the word that a thread still leaving the previous one acquires.
  unsigned char barrier_sync[2] = {}, shuffle_sync[kMaxWarps][2] = {};
  unsigned char block_start_sync = 0, block_end_sync = 0;

  Engine() = default;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  ~Engine() {
#ifdef MT_CUDA_EMU_TSAN
    void* self = __tsan_get_current_fiber();
#endif
    for (auto& f : fibers) {
#ifdef MT_CUDA_EMU_TSAN
      // The fiber waits for a next block inside its bookkeeping's ignore (fiber_main): end it
      // as that fiber (a TSan switch only, not a stack switch), then destroy it.
      __tsan_switch_to_fiber(f->tsan_fiber, __tsan_switch_to_fiber_no_sync);
      __tsan_ignore_thread_end();
      __tsan_switch_to_fiber(self, __tsan_switch_to_fiber_no_sync);
      __tsan_destroy_fiber(f->tsan_fiber);
#endif
      munmap(f->mapping, kGuardBytes + kFiberStackBytes);
    }
  }
};

inline Engine g_engine;

#ifdef MT_CUDA_EMU_ASAN
// After a switch, on the stack switched to: ASan's fake stack back, and the scheduler's
// stack noted when the switch came from there.
inline void finish_asan_switch(void* fake_stack) {
  Engine& e = g_engine;
  const void* bottom = nullptr;
  size_t bytes = 0;
  __sanitizer_finish_switch_fiber(fake_stack, &bottom, &bytes);
  if (e.from_scheduler) {
    e.scheduler_stack = bottom;
    e.scheduler_stack_bytes = bytes;
  }
}
#endif

inline Fiber& current_fiber() {
  if (!g_engine.current) fail("a CUDA device function called outside cuda_emu::launch");
  return *g_engine.current;
}

// From `from` to `to` (null: the scheduler, that is the launching thread); returns when
// something switches back to `from`.
inline void switch_context(Fiber* from, Fiber* to) {
  Engine& e = g_engine;
  e.current = to;
  if (to) threadIdx = {to->tid, 0, 0};
#ifdef MT_CUDA_EMU_TSAN
  __tsan_switch_to_fiber(to ? to->tsan_fiber : e.tsan_scheduler, __tsan_switch_to_fiber_no_sync);
#endif
#ifdef MT_CUDA_EMU_ASAN
  void* scheduler_fake_stack = nullptr;
  void** fake_stack = from ? &from->asan_fake_stack : &scheduler_fake_stack;
  e.from_scheduler = !from;
  if (to)
    __sanitizer_start_switch_fiber(fake_stack, to->mapping + kGuardBytes, kFiberStackBytes);
  else
    __sanitizer_start_switch_fiber(fake_stack, e.scheduler_stack, e.scheduler_stack_bytes);
#endif
  swapcontext(from ? &from->context : &e.scheduler, to ? &to->context : &e.scheduler);
#ifdef MT_CUDA_EMU_ASAN
  finish_asan_switch(*fake_stack);
#endif
}

// The running fiber gives way to the next runnable one in threadIdx order (itself when it is
// the only one), or to the scheduler when all have returned.
inline void yield(Fiber& self) {
  Engine& e = g_engine;
  for (unsigned i = 1; i <= e.threads; ++i) {
    Fiber& next = *e.fibers[(self.tid + i) % e.threads];
    if (next.state != State::kRunnable) continue;
    if (&next != &self) switch_context(&self, &next);
    return;
  }
  if (e.running == 0) {
    switch_context(&self, nullptr);
    return;
  }
  // Every live thread waits, some at a barrier, others at a shuffle.
  for (unsigned t = 0; t < e.threads; ++t)
    if (e.fibers[t]->state == State::kAtShuffle)
      fail(
          "threads wait at a __syncthreads while others wait at a shuffle (thread at a "
          "shuffle, its shuffle count)",
          t, e.fibers[t]->shuffles);
  fail("no thread of the block can go on (running threads, at a barrier)", e.running, e.at_barrier);
}

// Every fiber's code: one block's kernel call after another.
inline void fiber_main() {
  Engine& e = g_engine;
#ifdef MT_CUDA_EMU_ASAN
  finish_asan_switch(nullptr);
#endif
  Fiber& self = *e.current;
  for (;;) {
    tsan_acquire(&e.block_start_sync);
    e.body(e.call);
    tsan_release(&e.block_end_sync);
    tsan_ignore_begin();
    // Returned: out of the block. A thread waiting at a barrier (a lane at a shuffle) will
    // never see this one arrive.
    if (e.at_barrier > 0)
      fail("threads of a block passed different numbers of __syncthreads (thread, count)", self.tid,
           self.syncs);
    if (e.at_shuffle[self.tid / kWarpSize] > 0)
      fail("lanes of a warp made different numbers of shuffles (thread, count)", self.tid,
           self.shuffles);
    self.state = State::kReturned;
    --e.running;
    ++e.returned;
    yield(self);  // back here for the next block
    tsan_ignore_end();
  }
}

inline void init_context(ucontext_t& c, unsigned char* stack) {
  getcontext(&c);
  c.uc_stack.ss_sp = stack;
  c.uc_stack.ss_size = kFiberStackBytes;
  c.uc_link = nullptr;  // fiber_main never returns
  makecontext(&c, &fiber_main, 0);
  // The stack pointer is in the saved registers now; without uc_stack, ASan's swapcontext
  // interceptor does not clear the stack's shadow (the live frames' redzones) at each switch
  // to the fiber.
  c.uc_stack = {};
}

// Fibers for threads [fibers.size(), threads).
inline void add_fibers(unsigned threads) {
  Engine& e = g_engine;
  while (e.fibers.size() < threads) {
    e.fibers.push_back(std::make_unique<Fiber>());
    Fiber& f = *e.fibers.back();
    f.tid = static_cast<unsigned>(e.fibers.size() - 1);
    void* m = mmap(nullptr, kGuardBytes + kFiberStackBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (m == MAP_FAILED)
      fail("launch: no memory for a thread's stack (thread, bytes)", f.tid,
           static_cast<long long>(kFiberStackBytes));
    f.mapping = static_cast<unsigned char*>(m);
    mprotect(f.mapping, kGuardBytes, PROT_NONE);  // an overflow faults
    init_context(f.context, f.mapping + kGuardBytes);
#ifdef MT_CUDA_EMU_TSAN
    f.tsan_fiber = __tsan_create_fiber(0);
#endif
  }
}

// One block: the scheduler starts thread 0, the threads run round robin among themselves
// (yield), and the last one to return switches back.
inline void run_block() {
  Engine& e = g_engine;
  for (unsigned t = 0; t < e.threads; ++t) {
    Fiber& f = *e.fibers[t];
    f.state = State::kRunnable;
    f.syncs = 0;
    f.shuffles = 0;
  }
  e.running = e.threads;
  e.returned = 0;
  e.at_barrier = 0;
  std::fill_n(e.at_shuffle, kMaxWarps, 0u);
  tsan_release(&e.block_start_sync);
  switch_context(nullptr, e.fibers[0].get());
  tsan_acquire(&e.block_end_sync);
}

}  // namespace detail
}  // namespace mt::cuda_emu

namespace mt::cuda_emu::detail {

// Bytes [p, p + extent) inside the launch's dynamic shared memory.
inline void check_shared(const void* p, size_t extent) {
  current_fiber();
  const auto* c = static_cast<const unsigned char*>(p);
  const unsigned char* base = g_dynamic_shared;
  const size_t bytes = g_engine.shared_bytes;
  if (!base || c < base || c + extent > base + bytes)
    fail("WMMA operand outside the launch's dynamic shared memory (byte offset, extent)",
         base ? static_cast<long long>(c - base) : -1, static_cast<long long>(extent));
}

}  // namespace mt::cuda_emu::detail

// ---- barriers and shuffles ------------------------------------------------------------------
inline void __syncthreads() {
  namespace d = mt::cuda_emu::detail;
  d::Engine& e = d::g_engine;
  d::Fiber& self = d::current_fiber();
  void* sync = &e.barrier_sync[self.syncs & 1u];
  d::tsan_release(sync);  // what this thread did before the barrier
  d::tsan_ignore_begin();
  if (e.returned > 0)  // a thread that returned will never arrive
    for (unsigned t = 0; t < e.threads; ++t)
      if (e.fibers[t]->state == d::State::kReturned)
        mt::cuda_emu::fail(
            "threads of a block passed different numbers of __syncthreads (thread, count)", t,
            e.fibers[t]->syncs);
  ++self.syncs;
  self.state = d::State::kAtBarrier;
  if (++e.at_barrier == e.threads) {  // the last one: all go on
    for (unsigned t = 0; t < e.threads; ++t) e.fibers[t]->state = d::State::kRunnable;
    e.at_barrier = 0;
  }
  d::yield(self);
  d::tsan_ignore_end();
  d::tsan_acquire(sync);  // what every thread did before the barrier
}

// The lanes write their values to one half of the warp's buffer and read their partner's once
// all 32 have written. Consecutive shuffles use alternate halves: a lane writes a half again
// only after the shuffle in between, which every lane reaches only after reading the half.
inline float __shfl_xor_sync(unsigned mask, float v, int lane_mask, int width = 32) {
  namespace d = mt::cuda_emu::detail;
  using mt::cuda_emu::kWarpSize;
  if (mask != 0xffffffffu || width != 32 || lane_mask < 0 || lane_mask >= 32)
    mt::cuda_emu::fail(
        "__shfl_xor_sync: only the full mask, width 32 and lane_mask 0..31 (mask, lane_mask)",
        static_cast<long long>(mask), lane_mask);
  d::Engine& e = d::g_engine;
  d::Fiber& self = d::current_fiber();
  const unsigned warp = self.tid / kWarpSize, lane = self.tid % kWarpSize;
  const unsigned half = self.shuffles & 1u;
  void* sync = &e.shuffle_sync[warp][half];
  d::tsan_release(sync);
  d::tsan_ignore_begin();
  e.shuffle[warp][half][lane] = v;
  for (unsigned t = warp * kWarpSize; t < (warp + 1) * kWarpSize; ++t)
    if (e.fibers[t]->state == d::State::kReturned)  // a lane that will never arrive
      mt::cuda_emu::fail("lanes of a warp made different numbers of shuffles (thread, count)", t,
                         e.fibers[t]->shuffles);
  ++self.shuffles;
  self.state = d::State::kAtShuffle;
  if (++e.at_shuffle[warp] == kWarpSize) {  // the last lane: the warp goes on
    for (unsigned t = warp * kWarpSize; t < (warp + 1) * kWarpSize; ++t)
      e.fibers[t]->state = d::State::kRunnable;
    e.at_shuffle[warp] = 0;
  }
  d::yield(self);
  const float r = e.shuffle[warp][half][lane ^ static_cast<unsigned>(lane_mask)];
  d::tsan_ignore_end();
  d::tsan_acquire(sync);
  return r;
}

// ---- bits and IEEE single-operation intrinsics ---------------------------------------------
inline std::uint32_t __float_as_uint(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
inline float __uint_as_float(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }

// ---- bf16 -----------------------------------------------------------------------------------
// The copies copy the member: GCC's TSan does not instrument the copy of a 2-byte struct as a
// whole, so a race on a bf16 tile in shared memory would go unseen.
struct __nv_bfloat16 {
  std::uint16_t bits;
  __nv_bfloat16() = default;
  __nv_bfloat16(const __nv_bfloat16& o) : bits(o.bits) {}
  __nv_bfloat16& operator=(const __nv_bfloat16& o) {
    bits = o.bits;
    return *this;
  }
};
static_assert(sizeof(__nv_bfloat16) == 2);

inline __nv_bfloat16 __float2bfloat16_rn(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  __nv_bfloat16 h;
  if ((u & 0x7fffffffu) > 0x7f800000u)  // NaN: keep it a (quiet) NaN
    h.bits = static_cast<std::uint16_t>((u >> 16) | 0x40u);
  else
    h.bits = static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // to even
  return h;
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
  detail::Engine& e = detail::g_engine;
  if (e.launching) fail("launch: called while a launch runs (a kernel's launch, or two threads)");
  if (threads == 0 || threads > kMaxBlockThreads || threads % kWarpSize != 0)
    fail("launch: threads per block must be a multiple of 32 up to 1024 (threads)", threads);
  if (shared_bytes > kMaxDynamicSharedBytes)
    fail("launch: more dynamic shared memory than a block can have (bytes, limit)",
         static_cast<long long>(shared_bytes), static_cast<long long>(kMaxDynamicSharedBytes));
  if (shared_bytes > 0 && !g_dynamic_shared)
    fail("launch: shared memory asked for, but no MT_CUDA_EMU_DYNAMIC_SHARED array");
  const unsigned long long n_blocks = 1ull * grid.x * grid.y * grid.z;
  if (n_blocks == 0) return;

  struct Call {
    void (*kernel)(Params...);
    std::tuple<Params...> params;
  };
  const Call call{kernel, std::tuple<Params...>(std::forward<Args>(args)...)};
  e.launching = true;
  detail::add_fibers(threads);
#ifdef MT_CUDA_EMU_TSAN
  e.tsan_scheduler = __tsan_get_current_fiber();
#endif
  detail::tsan_ignore_begin();  // the launching thread's bookkeeping, up to the end
  e.body = [](const void* c) {
    const Call& k = *static_cast<const Call*>(c);
    std::apply(k.kernel, k.params);
  };
  e.call = &call;
  e.threads = threads;
  e.shared_bytes = shared_bytes;
  blockDim = {threads, 1, 1};
  gridDim = grid;
#ifdef MT_CUDA_EMU_ASAN
  if (g_dynamic_shared)
    ASAN_POISON_MEMORY_REGION(g_dynamic_shared + shared_bytes,
                              kMaxDynamicSharedBytes - shared_bytes);
#endif
  for (unsigned long long b = 0; b < n_blocks; ++b) {
    blockIdx = {static_cast<unsigned>(b % grid.x), static_cast<unsigned>(b / grid.x % grid.y),
                static_cast<unsigned>(b / grid.x / grid.y)};
    if (shared_bytes > 0) std::memset(g_dynamic_shared, 0xff, shared_bytes);  // NaN
    detail::run_block();
  }
#ifdef MT_CUDA_EMU_ASAN
  if (g_dynamic_shared) ASAN_UNPOISON_MEMORY_REGION(g_dynamic_shared, kMaxDynamicSharedBytes);
#endif
  e.body = nullptr;
  e.call = nullptr;
  e.launching = false;
  detail::tsan_ignore_end();
}

}  // namespace mt::cuda_emu

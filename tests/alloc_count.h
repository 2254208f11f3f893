// Counts every heap allocation of the process: malloc, calloc, realloc, posix_memalign,
// aligned_alloc, memalign (the C library's, which libstdc++'s operator new, oneDNN and
// OpenMP all come down to) and operator new on top of them, and the allocations still live.
// Include it in exactly one file of a test executable: it replaces the allocation functions
// for the whole process (glibc lets an executable interpose them; they forward to glibc's
// own __libc_* entry points). Under ASan/TSan, which interpose them themselves,
// kAllocCounting is false and the counts stay 0: a test then skips its count checks.
#pragma once

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MT_ALLOC_COUNTING 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define MT_ALLOC_COUNTING 0
#endif
#endif
#ifndef MT_ALLOC_COUNTING
#define MT_ALLOC_COUNTING 1
#endif

namespace mt::test {

inline constexpr bool kAllocCounting = MT_ALLOC_COUNTING != 0;

struct AllocCounts {
  std::atomic<int64_t> allocations{0};  // every successful allocation (realloc included)
  std::atomic<int64_t> frees{0};        // every free of a non-null pointer
  std::atomic<int64_t> news{0};         // operator new calls (each also an allocation)
};
inline AllocCounts g_alloc;

// Allocations and net live blocks (allocations - frees) since a point.
struct AllocMark {
  int64_t allocations = g_alloc.allocations.load();
  int64_t frees = g_alloc.frees.load();
  int64_t news = g_alloc.news.load();
  int64_t allocations_since() const { return g_alloc.allocations.load() - allocations; }
  int64_t live_since() const {
    return (g_alloc.allocations.load() - allocations) - (g_alloc.frees.load() - frees);
  }
  int64_t news_since() const { return g_alloc.news.load() - news; }
};

}  // namespace mt::test

#if MT_ALLOC_COUNTING
extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
void __libc_free(void*);

inline void* mt_counted(void* p) {
  if (p) mt::test::g_alloc.allocations.fetch_add(1, std::memory_order_relaxed);
  return p;
}
void* malloc(size_t n) { return mt_counted(__libc_malloc(n)); }
void* calloc(size_t n, size_t k) { return mt_counted(__libc_calloc(n, k)); }
void* realloc(void* p, size_t n) {
  void* q = __libc_realloc(p, n);
  // realloc(p, n) is a free of p and an allocation of q (null p: an allocation; n 0: a free).
  if (p && (q || n == 0)) mt::test::g_alloc.frees.fetch_add(1, std::memory_order_relaxed);
  return mt_counted(q);
}
void* memalign(size_t a, size_t n) { return mt_counted(__libc_memalign(a, n)); }
void* aligned_alloc(size_t a, size_t n) { return mt_counted(__libc_memalign(a, n)); }
int posix_memalign(void** out, size_t a, size_t n) {
  void* p = mt_counted(__libc_memalign(a, n));
  if (!p) return ENOMEM;
  *out = p;
  return 0;
}
void free(void* p) {
  if (p) mt::test::g_alloc.frees.fetch_add(1, std::memory_order_relaxed);
  __libc_free(p);
}
}  // extern "C"

void* operator new(std::size_t bytes) {
  mt::test::g_alloc.news.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(bytes ? bytes : 1)) return p;
  throw std::bad_alloc();
}
// Out of line: inlined into a caller, GCC 12 reports free() of operator new's pointer
// (-Wmismatched-new-delete), not knowing that this operator new is malloc.
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#endif

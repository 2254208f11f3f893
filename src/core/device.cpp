#include "core/device.h"

#include <cstring>
#include <map>

#include "core/error.h"

#if MESHTRAIN_CUDA
#include <cuda_runtime.h>
#endif

namespace mt::device {

namespace {
thread_local mem::Device t_device = mem::Device::kCpu;
thread_local int t_index = 0;

#if MESHTRAIN_CUDA
// The calling thread's stream on its current GPU, made by use_cuda: one per (thread, GPU),
// like the kernels' Context, kept in t_streams and never destroyed (it lives as long as the
// thread's rank). A thread that comes back to a GPU gets that GPU's stream again, so the
// work queued on it (and the Context's workspace it uses) stays in one order.
thread_local cudaStream_t t_stream = nullptr;
thread_local std::map<int, cudaStream_t> t_streams;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    fail_run("CUDA: {} failed: {} ({})", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

cudaMemcpyKind kind_of(mem::Device dst, mem::Device src) {
  const bool d = dst == mem::Device::kCuda, s = src == mem::Device::kCuda;
  return d && s ? cudaMemcpyDeviceToDevice
         : d    ? cudaMemcpyHostToDevice
         : s    ? cudaMemcpyDeviceToHost
                : cudaMemcpyHostToHost;
}
#endif
}  // namespace

mem::Device current() { return t_device; }
int current_index() { return t_index; }

void use_cpu() {
  t_device = mem::Device::kCpu;
  t_index = 0;
}

ScopedCpu::ScopedCpu() : device_(t_device), index_(t_index) { t_device = mem::Device::kCpu; }
ScopedCpu::~ScopedCpu() {
  t_device = device_;
  t_index = index_;
}

#if MESHTRAIN_CUDA

bool cuda_built() { return true; }

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no GPU: not an error here
    return 0;
  }
  return n;
}

bool cuda_memory(int index, int64_t& free_bytes, int64_t& total_bytes) {
  if (index < 0 || index >= cuda_device_count()) return false;
  int was = 0;
  if (cudaGetDevice(&was) != cudaSuccess || cudaSetDevice(index) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  size_t f = 0, t = 0;
  const bool ok = cudaMemGetInfo(&f, &t) == cudaSuccess;
  if (!ok) (void)cudaGetLastError();
  (void)cudaSetDevice(was);
  free_bytes = static_cast<int64_t>(f);
  total_bytes = static_cast<int64_t>(t);
  return ok;
}

void use_cuda(int index) {
  const int n = cuda_device_count();
  if (n == 0)
    fail(
        "--device cuda: no CUDA GPU is visible (cudaGetDeviceCount found none; check "
        "nvidia-smi and CUDA_VISIBLE_DEVICES, or train with --device cpu)");
  if (index < 0 || index >= n)
    fail(
        "--device cuda: GPU {} does not exist ({} visible: 0..{}); give each rank its own "
        "GPU or fewer ranks per host",
        index, n, n - 1);
  check(cudaSetDevice(index), "cudaSetDevice");
  // A stream belongs to the GPU it was made on (not t_index: use_cpu resets that to 0, and
  // use_cuda(1), use_cpu(), use_cuda(0) must not launch on GPU 1's stream).
  cudaStream_t& s = t_streams[index];
  if (!s) check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  t_stream = s;
  t_device = mem::Device::kCuda;
  t_index = index;
}

void* cuda_stream() { return t_device == mem::Device::kCuda ? t_stream : nullptr; }

void copy(void* dst, mem::Device dst_device, const void* src, mem::Device src_device,
          int64_t bytes) {
  if (bytes <= 0) return;
  if (dst_device == mem::Device::kCpu && src_device == mem::Device::kCpu) {
    std::memmove(dst, src, static_cast<size_t>(bytes));
    return;
  }
  // On the thread's stream (ordered after its kernels), then wait: the caller may read or
  // reuse the host side at once.
  check(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), kind_of(dst_device, src_device),
                        t_stream),
        "cudaMemcpyAsync");
  check(cudaStreamSynchronize(t_stream), "cudaStreamSynchronize (copy)");
}

void zero(void* p, mem::Device d, int64_t bytes) {
  if (bytes <= 0) return;
  if (d == mem::Device::kCpu) {
    std::memset(p, 0, static_cast<size_t>(bytes));
    return;
  }
  check(cudaMemsetAsync(p, 0, static_cast<size_t>(bytes), t_stream), "cudaMemsetAsync");
}

void synchronize() {
  if (t_device == mem::Device::kCuda)
    check(cudaStreamSynchronize(t_stream), "cudaStreamSynchronize");
}

std::shared_ptr<void> record_event() {
  if (t_device != mem::Device::kCuda) return nullptr;
  cudaEvent_t e = nullptr;
  check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  std::shared_ptr<void> owned(e,
                              [](void* p) { (void)cudaEventDestroy(static_cast<cudaEvent_t>(p)); });
  check(cudaEventRecord(e, t_stream), "cudaEventRecord");
  return owned;
}

std::string describe(mem::Device d, int index) {
  if (d == mem::Device::kCpu) return "cpu";
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, index), "cudaGetDeviceProperties");
  return fmt::format("{}, sm_{}{}, {} SMs, {:.1f} GiB", p.name, p.major, p.minor,
                     p.multiProcessorCount, static_cast<double>(p.totalGlobalMem) / (1 << 30));
}

void* cuda_malloc(int64_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, static_cast<size_t>(bytes));
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    // Not every failure is a lack of memory: cudaMalloc also returns the sticky error of an
    // earlier faulting kernel (an illegal address, say), which no smaller microbatch fixes.
    if (e != cudaErrorMemoryAllocation)
      fail_run("CUDA: cudaMalloc of {} bytes failed: {} ({})", bytes, cudaGetErrorString(e),
               cudaGetErrorName(e));
    size_t free_b = 0, total_b = 0;
    (void)cudaMemGetInfo(&free_b, &total_b);
    fail_run(
        "out of memory on the GPU allocating {} bytes ({:.2f} GiB free of {:.2f} GiB): use a "
        "smaller --microbatch, --recompute selective/full, --zero 1-3 or more ranks",
        bytes, static_cast<double>(free_b) / (1 << 30), static_cast<double>(total_b) / (1 << 30));
  }
  return p;
}

void cuda_free(void* p) {
  if (p) (void)cudaFree(p);  // at exit the context may already be gone: nothing to report
}

#else  // CPU-only build

namespace {
[[noreturn]] void not_built() {
  fail(
      "this meshtrain was built without CUDA: configure with -DMESHTRAIN_CUDA=ON on a "
      "machine with nvcc (the CUDA toolkit), build again, or use --device cpu");
}
}  // namespace

bool cuda_built() { return false; }
int cuda_device_count() { return 0; }
bool cuda_memory(int, int64_t&, int64_t&) { return false; }
void use_cuda(int) { not_built(); }
void* cuda_stream() { return nullptr; }

void copy(void* dst, mem::Device dst_device, const void* src, mem::Device src_device,
          int64_t bytes) {
  if (dst_device != mem::Device::kCpu || src_device != mem::Device::kCpu) not_built();
  if (bytes > 0) std::memmove(dst, src, static_cast<size_t>(bytes));
}

void zero(void* p, mem::Device d, int64_t bytes) {
  if (d != mem::Device::kCpu) not_built();
  if (bytes > 0) std::memset(p, 0, static_cast<size_t>(bytes));
}

void synchronize() {}
std::shared_ptr<void> record_event() { return nullptr; }
std::string describe(mem::Device d, int) { return d == mem::Device::kCpu ? "cpu" : "cuda"; }
void* cuda_malloc(int64_t) { not_built(); }
void cuda_free(void*) {}

#endif

}  // namespace mt::device

// The measured GEMM rate of the current GPU: the median of `reps` event-timed runs of an
// n x n x n GEMM (C = A B^T, the shape of linear_forward) on random data.
#include <algorithm>
#include <vector>

#include "core/device.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/kernels_cuda.h"

namespace mt::kernels::cuda {
namespace {

using namespace detail;

// A hash of i mapped to [-1, 1): random enough that no data-dependent shortcut applies.
__device__ inline float random_value(int64_t i, uint32_t seed) {
  uint32_t h = static_cast<uint32_t>(i) * 0x9E3779B1u ^ seed;
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return static_cast<float>(h >> 8) * (1.0f / 8388608.0f) - 1.0f;
}

__global__ void fill_random_kernel(float* f32, uint16_t* b16, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = random_value(i, seed);
    if (f32) f32[i] = v;
    if (b16) b16[i] = bf16_bits(v);
  }
}

// Device memory freed on every path out (the events likewise).
struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(int64_t bytes) : p(device::cuda_malloc(bytes)) {}
  ~DeviceBuffer() { device::cuda_free(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};
struct Event {
  cudaEvent_t e = nullptr;
  Event() { check_cuda(cudaEventCreate(&e), "cudaEventCreate"); }
  ~Event() { (void)cudaEventDestroy(e); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
};

}  // namespace

double time_gemm_flops(int64_t n, bool bf16_operands, int reps) {
  if (n < 1) fail_input("time_gemm_flops: n must be >= 1, got " + str(n));
  reps = std::max(1, reps);
  const int64_t elems = n * n, esize = bf16_operands ? 2 : 4;
  DeviceBuffer a(elems * esize), b(elems * esize), c(elems * 4);
  for (int k = 0; k < 2; ++k) {
    void* p = k == 0 ? a.p : b.p;
    fill_random_kernel<<<grid_for(elems), kThreads, 0, stream()>>>(
        bf16_operands ? nullptr : static_cast<float*>(p),
        bf16_operands ? static_cast<uint16_t*>(p) : nullptr, elems, 1234u + static_cast<uint32_t>(k));
    check_launch("fill_random_kernel");
  }
  auto once = [&] {
    if (bf16_operands)
      gemm_bf16(false, true, n, n, n, 1.0f, static_cast<const bf16*>(a.p), n,
                static_cast<const bf16*>(b.p), n, 0.0f, static_cast<float*>(c.p), n);
    else
      gemm(false, true, n, n, n, 1.0f, static_cast<const float*>(a.p), n,
           static_cast<const float*>(b.p), n, 0.0f, static_cast<float*>(c.p), n);
  };
  once();  // warm-up: builds the plan, loads the kernel
  Event start, stop;
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    check_cuda(cudaEventRecord(start.e, stream()), "cudaEventRecord (start)");
    once();
    check_cuda(cudaEventRecord(stop.e, stream()), "cudaEventRecord (stop)");
    check_cuda(cudaEventSynchronize(stop.e), "cudaEventSynchronize");
    float ms = 0.0f;
    check_cuda(cudaEventElapsedTime(&ms, start.e, stop.e), "cudaEventElapsedTime");
    times.push_back(static_cast<double>(ms) * 1e-3);
  }
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2];
  if (!(median > 0.0)) fail_runtime("time_gemm_flops: the timed GEMM took no measurable time");
  const double dn = static_cast<double>(n);
  return 2.0 * dn * dn * dn / median;
}

}  // namespace mt::kernels::cuda

// Measured rates of the current GPU, for MFU (time_gemm_flops) and `meshtrain calibrate
// --device cuda` (GEMM by shape, memory-bound kernels, fused attention, the launch floor).
// Every time is taken with CUDA events on the thread's stream, on random data (no
// data-dependent shortcut), after a warm-up (cuBLASLt's plan, the kernel's load).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "core/device.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/flash_attention.h"
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

// Seconds per call of `work` in a stream of back-to-back calls, as training queues them: one
// timed call sizes a batch of at least ~2 ms, then the median over `reps` batches of the
// batch's time / its calls (a lone call would add the event's own latency to short kernels).
template <class Work>
double seconds_per_call(int reps, Work work) {
  Event start, stop;
  auto timed = [&](int calls) {
    check_cuda(cudaEventRecord(start.e, stream()), "cudaEventRecord (start)");
    for (int i = 0; i < calls; ++i) work();
    check_cuda(cudaEventRecord(stop.e, stream()), "cudaEventRecord (stop)");
    check_cuda(cudaEventSynchronize(stop.e), "cudaEventSynchronize");
    float ms = 0.0f;
    check_cuda(cudaEventElapsedTime(&ms, start.e, stop.e), "cudaEventElapsedTime");
    return static_cast<double>(ms) * 1e-3 / calls;
  };
  work();  // warm-up: builds the plan, loads the kernel
  const double one = std::max(1e-7, timed(1));
  const int calls = static_cast<int>(std::clamp(2e-3 / one, 1.0, 1000.0));
  std::vector<double> times;
  for (int r = 0; r < std::max(1, reps); ++r) times.push_back(timed(calls));
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2];
  if (!(median > 0.0)) fail_runtime("microbench: the timed kernel took no measurable time");
  return median;
}

void fill_random(void* p, int64_t elems, bool bf16, uint32_t seed) {
  fill_random_kernel<<<grid_for(elems), kThreads, 0, stream()>>>(
      bf16 ? nullptr : static_cast<float*>(p), bf16 ? static_cast<uint16_t*>(p) : nullptr, elems,
      seed);
  check_launch("fill_random_kernel");
}

__global__ void empty_kernel() {}

}  // namespace

double time_gemm_flops(int64_t n, bool bf16_operands, int reps) {
  if (n < 1) fail_input("time_gemm_flops: n must be >= 1, got " + str(n));
  return time_gemm_shape(n, n, n, bf16_operands, reps);
}

double time_gemm_shape(int64_t M, int64_t N, int64_t K, bool bf16_operands, int reps) {
  if (M < 1 || N < 1 || K < 1)
    fail_input("time_gemm_shape: M, N, K must be >= 1, got " + str(M) + " x " + str(N) + " x " +
               str(K));
  const int64_t esize = bf16_operands ? 2 : 4;
  DeviceBuffer a(M * K * esize), b(N * K * esize), c(M * N * 4);
  fill_random(a.p, M * K, bf16_operands, 1234u);
  fill_random(b.p, N * K, bf16_operands, 1235u);
  // C[M, N] = A[M, K] B[N, K]^T: linear_forward's product (tokens x in times out x in).
  const double s = seconds_per_call(reps, [&] {
    if (bf16_operands)
      gemm_bf16(false, true, M, N, K, 1.0f, static_cast<const bf16*>(a.p), K,
                static_cast<const bf16*>(b.p), K, 0.0f, static_cast<float*>(c.p), N);
    else
      gemm(false, true, M, N, K, 1.0f, static_cast<const float*>(a.p), K,
           static_cast<const float*>(b.p), K, 0.0f, static_cast<float*>(c.p), N);
  });
  return 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) / s;
}

std::vector<double> time_gemm_table(const std::vector<double>& m, const std::vector<double>& n,
                                    const std::vector<double>& k, int reps) {
  if (m.empty() || n.empty() || k.empty()) fail_input("time_gemm_table: an empty grid");
  const auto big = [](const std::vector<double>& v) {
    return static_cast<int64_t>(*std::max_element(v.begin(), v.end()));
  };
  const int64_t M = big(m), N = big(n), K = big(k);
  DeviceBuffer a(M * K * 2), b(N * K * 2), c(M * N * 4);
  fill_random(a.p, M * K, true, 1234u);
  fill_random(b.p, N * K, true, 1235u);
  std::vector<double> rates;
  for (double dm : m)
    for (double dn : n)
      for (double dk : k) {
        const int64_t im = static_cast<int64_t>(dm), in = static_cast<int64_t>(dn),
                      ik = static_cast<int64_t>(dk);
        const double s = seconds_per_call(reps, [&] {
          gemm_bf16(false, true, im, in, ik, 1.0f, static_cast<const bf16*>(a.p), ik,
                    static_cast<const bf16*>(b.p), ik, 0.0f, static_cast<float*>(c.p), in);
        });
        rates.push_back(2.0 * dm * dn * dk / s);
      }
  return rates;
}

SustainedRate time_gemm_sustained(int64_t n, double seconds) {
  if (n < 1) fail_input("time_gemm_sustained: n must be >= 1, got " + str(n));
  DeviceBuffer a(n * n * 2), b(n * n * 2), c(n * n * 4);
  fill_random(a.p, n * n, true, 21u);
  fill_random(b.p, n * n, true, 22u);
  auto once = [&] {
    gemm_bf16(false, true, n, n, n, 1.0f, static_cast<const bf16*>(a.p), n,
              static_cast<const bf16*>(b.p), n, 0.0f, static_cast<float*>(c.p), n);
  };
  const double flops = 2.0 * static_cast<double>(n) * n * n;
  // After a second's rest the card is back at its boost clock: the burst rate is what
  // calibrate's table measures (~2 ms batches).
  check_cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
  std::this_thread::sleep_for(std::chrono::seconds(1));
  SustainedRate r;
  r.burst_flops_per_s = flops / seconds_per_call(5, once);
  // Then back to back for `seconds`, in windows of about 0.5 s; the median of the last half's
  // windows is the rate the power limit allows.
  const int per_window = std::max(1, static_cast<int>(0.5 * r.burst_flops_per_s / flops));
  Event start, stop;
  std::vector<double> rates;
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < seconds) {
    check_cuda(cudaEventRecord(start.e, stream()), "cudaEventRecord (start)");
    for (int i = 0; i < per_window; ++i) once();
    check_cuda(cudaEventRecord(stop.e, stream()), "cudaEventRecord (stop)");
    check_cuda(cudaEventSynchronize(stop.e), "cudaEventSynchronize");
    float ms = 0.0f;
    check_cuda(cudaEventElapsedTime(&ms, start.e, stop.e), "cudaEventElapsedTime");
    rates.push_back(flops * per_window / (static_cast<double>(ms) * 1e-3));
  }
  std::vector<double> tail(rates.begin() + static_cast<std::ptrdiff_t>(rates.size() / 2),
                           rates.end());
  std::sort(tail.begin(), tail.end());
  r.sustained_flops_per_s = tail.empty() ? r.burst_flops_per_s : tail[tail.size() / 2];
  r.windows = static_cast<int>(rates.size());
  return r;
}

MemoryRates time_memory_rates(int64_t bytes, int reps) {
  const int64_t n = std::max<int64_t>(1, bytes / 4);
  DeviceBuffer x(n * 4), y(n * 4), z(n * 4);
  fill_random(x.p, n, false, 7u);
  fill_random(y.p, n, false, 8u);
  float* px = static_cast<float*>(x.p);
  float* py = static_cast<float*>(y.p);
  float* pz = static_cast<float*>(z.p);
  MemoryRates r;
  const double dn = static_cast<double>(n) * 4.0;
  r.copy_bytes_per_s = 2 * dn / seconds_per_call(reps, [&] { copy(pz, px, n); });
  r.add_bytes_per_s = 3 * dn / seconds_per_call(reps, [&] { add(pz, px, py, n); });
  return r;
}

LaunchTimes time_launches(int launches) {
  launches = std::max(10, launches);
  LaunchTimes t;
  t.gpu_s = seconds_per_call(5, [] {
    empty_kernel<<<1, 1, 0, stream()>>>();
    check_launch("empty_kernel");
  });
  // The host's side: enqueueing `launches` kernels without waiting (the queue never fills
  // at this count), per launch.
  check_cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < launches; ++i) empty_kernel<<<1, 1, 0, stream()>>>();
  const auto t1 = std::chrono::steady_clock::now();
  check_launch("empty_kernel");
  check_cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
  t.host_s = std::chrono::duration<double>(t1 - t0).count() / launches;
  return t;
}

AttentionTimes time_flash_attention(int64_t B, int64_t T, int64_t C, int64_t NH, int reps) {
  if (!detail::flash_attention_supports_head_dim(C / NH) || C % NH != 0)
    fail_input("time_flash_attention: head dim " + str(C / NH) + " has no fused kernel");
  if (T > detail::flash_attention_max_T())
    fail_input("time_flash_attention: T " + str(T) + " is above the fused kernels' limit " +
               str(detail::flash_attention_max_T()));
  const int64_t rows = B * NH * T;
  DeviceBuffer qkv(B * T * 3 * C * 4), out(B * T * C * 4), dout(B * T * C * 4),
      dqkv(B * T * 3 * C * 4), lse(rows * 4), d_rows(rows * 4);
  // Values in [-1, 1): the scaled scores have a standard deviation of about 1/3, so the
  // softmax is not saturated (no row is one key).
  fill_random(qkv.p, B * T * 3 * C, false, 11u);
  fill_random(dout.p, B * T * C, false, 12u);
  float* q = static_cast<float*>(qkv.p);
  AttentionTimes t;
  t.forward_s = seconds_per_call(reps, [&] {
    detail::flash_attention_forward(static_cast<float*>(out.p), static_cast<float*>(lse.p), q, B, T,
                                    C, NH);
  });
  t.backward_s = seconds_per_call(reps, [&] {
    detail::flash_attention_backward(static_cast<float*>(dqkv.p), static_cast<float*>(d_rows.p),
                                     static_cast<const float*>(dout.p), q,
                                     static_cast<const float*>(lse.p), B, T, C, NH);
  });
  return t;
}

GpuInfo gpu_info() {
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  cudaDeviceProp p{};
  check_cuda(cudaGetDeviceProperties(&p, dev), "cudaGetDeviceProperties");
  GpuInfo g;
  g.name = p.name;
  g.sms = p.multiProcessorCount;
  g.cc_major = p.major;
  g.cc_minor = p.minor;
  g.memory_bytes = static_cast<double>(p.totalGlobalMem);
  int clock_khz = 0, mem_khz = 0, bus_bits = 0;
  check_cuda(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev), "clock rate");
  check_cuda(cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, dev), "memory clock");
  check_cuda(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev), "bus width");
  g.sm_clock_hz = clock_khz * 1e3;
  // Double data rate: two transfers per memory clock over the bus.
  g.memory_bytes_per_s = 2.0 * mem_khz * 1e3 * bus_bits / 8.0;
  return g;
}

}  // namespace mt::kernels::cuda

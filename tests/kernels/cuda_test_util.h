// Helpers for the CUDA kernel tests: device buffers filled from host vectors (or poisoned
// with NaN, so that elements a kernel forgot to write are caught), a scope in which the
// calling thread computes on GPU 0, and the relative-norm comparison.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "kernels/kernels.h"
#include "kernels/test_util.h"

namespace mt::kernels::test {

inline bool have_gpu() { return device::cuda_device_count() > 0; }

#define MT_REQUIRE_GPU()                                                                        \
  do {                                                                                          \
    if (!::mt::kernels::test::have_gpu())                                                       \
      GTEST_SKIP() << "no CUDA GPU on this machine: the CUDA kernels are compiled but not run"; \
  } while (0)

// The calling thread computes on GPU 0 while this lives (kernels dispatch to kernels::cuda).
struct OnGpu {
  OnGpu() { device::use_cuda(0); }
  ~OnGpu() { device::use_cpu(); }
  OnGpu(const OnGpu&) = delete;
  OnGpu& operator=(const OnGpu&) = delete;
};

// A device array of T, from a host vector or poisoned.
template <class T>
class Gpu {
 public:
  explicit Gpu(const std::vector<T>& h) : n_(static_cast<int64_t>(h.size())) {
    alloc();
    device::copy(p_, mem::Device::kCuda, h.data(), mem::Device::kCpu, bytes());
  }
  // n elements, every byte 0xff: a NaN for f32 and bf16, -1 for int32.
  static Gpu poisoned(int64_t n) {
    std::vector<T> h(static_cast<size_t>(n));
    if (n > 0) std::memset(static_cast<void*>(h.data()), 0xff, static_cast<size_t>(n) * sizeof(T));
    return Gpu(h);
  }
  ~Gpu() { device::cuda_free(p_); }
  Gpu(Gpu&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; }
  Gpu(const Gpu&) = delete;
  Gpu& operator=(const Gpu&) = delete;

  T* get() { return p_; }
  const T* get() const { return p_; }
  // Waits for the thread's stream, then copies back.
  std::vector<T> host() const {
    std::vector<T> h(static_cast<size_t>(n_));
    device::copy(h.data(), mem::Device::kCpu, p_, mem::Device::kCuda, bytes());
    return h;
  }

 private:
  void alloc() { p_ = static_cast<T*>(device::cuda_malloc(n_ > 0 ? bytes() : sizeof(T))); }
  int64_t bytes() const { return n_ * static_cast<int64_t>(sizeof(T)); }
  T* p_ = nullptr;
  int64_t n_ = 0;
};

// ||got - want|| / ||want|| in double (NaN when got has a NaN: the check then fails).
inline double rel_norm(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double d = 0, w = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    const double e = static_cast<double>(got[i]) - want[i];
    d += e * e;
    w += static_cast<double>(want[i]) * want[i];
  }
  if (std::isnan(d)) return std::numeric_limits<double>::quiet_NaN();
  return std::sqrt(d) / std::max(std::sqrt(w), 1e-30);
}

#define MT_EXPECT_REL(got, want, tol, what)                                                 \
  do {                                                                                      \
    const double mt_rel_ = ::mt::kernels::test::rel_norm((got), (want));                    \
    EXPECT_TRUE(mt_rel_ <= (tol)) << (what) << ": relative norm error " << mt_rel_ << " > " \
                                  << (tol);                                                 \
  } while (0)

inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

inline std::vector<float> uniform(int64_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(gen);
  return v;
}

inline std::vector<int32_t> random_tokens(int64_t n, int32_t lo, int32_t hi, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> d(lo, hi - 1);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(gen);
  return v;
}

inline std::vector<bf16> to_bf16_host(const std::vector<float>& x) {
  std::vector<bf16> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = f32_to_bf16(x[i]);
  return y;
}

inline std::vector<float> bf16_to_f32_host(const std::vector<bf16>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = bf16_to_f32(x[i]);
  return y;
}

// The fused attention's log-sum-exp of causal scores, for its tests (the CPU kernel keeps the
// probabilities, not lse): lse[(b*NH + h)*T + t] = log sum_{j <= t} exp(q_t . k_j / sqrt(hd)),
// in double, from qkv [B, T, 3C].
inline std::vector<float> reference_lse(const std::vector<float>& qkv, int64_t B, int64_t T,
                                        int64_t C, int64_t NH) {
  const int64_t hd = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<float> lse(static_cast<size_t>(B * NH * T));
  std::vector<double> s(static_cast<size_t>(T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const float* q = qkv.data() + (b * T + t) * 3 * C + h * hd;
        double mx = -INFINITY;
        for (int64_t j = 0; j <= t; ++j) {
          const float* k = qkv.data() + (b * T + j) * 3 * C + C + h * hd;
          double d = 0;
          for (int64_t c = 0; c < hd; ++c) d += static_cast<double>(q[c]) * k[c];
          s[j] = d * scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j <= t; ++j) sum += std::exp(s[j] - mx);
        lse[(b * NH + h) * T + t] = static_cast<float>(mx + std::log(sum));
      }
  return lse;
}

// Columns [part*C, (part+1)*C) of every row of a [rows, 3C] array (q, k or v).
inline std::vector<float> part_of(const std::vector<float>& x, int64_t rows, int64_t C, int part) {
  std::vector<float> y(static_cast<size_t>(rows * C));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < C; ++c) y[r * C + c] = x[r * 3 * C + part * C + c];
  return y;
}

// The Euclidean norm, in double.
inline double norm(const std::vector<float>& x) {
  double s = 0;
  for (const float v : x) s += static_cast<double>(v) * v;
  return std::sqrt(s);  // NaN when x has one
}

// Inputs for the bf16 conversion tests: random values and every special case of the
// rounding (signed zeros, infinities, NaNs, the largest finite, subnormals, ties).
inline std::vector<float> bf16_conversion_inputs() {
  auto x = randn(1000, 120, 10.0f);
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {0.0f,
                            -0.0f,
                            inf,
                            -inf,
                            std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::signaling_NaN(),
                            std::numeric_limits<float>::max(),
                            -std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::denorm_min(),
                            1e-40f,
                            -3e-39f,
                            1.00390625f,  // a tie: 1 + 2^-8, rounds to even (1)
                            1.01171875f,  // a tie: 1 + 3*2^-8, rounds to even (up)
                            3.3895314e38f};
  x.insert(x.end(), std::begin(specials), std::end(specials));
  return x;
}

// Segment tables over 5000 elements for the multi-tensor AdamW tests: gaps between segments,
// empty segments (leading, inner, trailing), a one-element one, one spanning many blocks, and
// segments one element short of, exactly, and one past a block's 1024 elements.
inline std::vector<std::vector<AdamwSegment>> adamw_segment_tables() {
  return {
      {{0, 1000, 0.1f}, {1000, 0, 0.1f}, {1010, 1, 0.0f}, {1100, 3000, 0.05f}, {4200, 700, 0.1f}},
      {{0, 0, 0.1f},
       {3, 1023, 0.1f},
       {1026, 1024, 0.0f},
       {2050, 1025, 0.02f},
       {3077, 0, 0.1f},
       {3077, 1, 0.3f},
       {3081, 1917, 0.1f},
       {4999, 0, 0.1f}}};
}

}  // namespace mt::kernels::test

// What the emulated CUDA kernel tests share (cuda_emulated_test, cuda_llama_emulated_test):
// a launch the way the .cu files launch, and guarded output buffers that catch an element
// never written (poison) and a write outside the buffer (sentinels). Include after cuda_emu.h
// and the kernels' headers.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda_emu/cuda_emu.h"

namespace mt::kernels::emu_test {

namespace emu = cuda_emu;

inline constexpr unsigned kBlock = cuda::detail::kThreads;

// A launch of `blocks` blocks (x) of kThreads, no dynamic shared memory: how every .cu here
// launches.
template <class... Params, class... Args>
void run(void (*kernel)(Params...), emu::Dim3 grid, Args&&... args) {
  emu::launch(kernel, grid, kBlock, 0, std::forward<Args>(args)...);
}
inline emu::Dim3 blocks(int64_t n) { return {static_cast<unsigned>(n), 1, 1}; }

// An output buffer: n poison values (NaN for floats: an element never written stays NaN)
// between two guard zones of a sentinel (a write just outside the buffer changes one).
template <class T = float>
class Guarded {
 public:
  explicit Guarded(int64_t n, T poison = poison_of())
      : v_(static_cast<size_t>(n + 2 * kGuard), poison) {
    std::fill_n(v_.begin(), kGuard, sentinel());
    std::fill_n(v_.end() - kGuard, kGuard, sentinel());
  }
  // Starts from `init` instead of the poison (accumulated outputs).
  static Guarded from(const std::vector<T>& init) {
    Guarded g(static_cast<int64_t>(init.size()));
    std::copy(init.begin(), init.end(), g.get());
    return g;
  }
  T* get() { return v_.data() + kGuard; }
  std::vector<T> values() const {
    EXPECT_TRUE(guards_intact()) << "a write outside the buffer";
    return {v_.begin() + kGuard, v_.end() - kGuard};
  }

 private:
  static T poison_of() {
    if constexpr (std::is_floating_point_v<T>)
      return std::numeric_limits<T>::quiet_NaN();
    else
      return static_cast<T>(0xa5a5a5a5u);
  }
  static T sentinel() { return static_cast<T>(12345); }
  bool guards_intact() const {
    auto is = [](T x) { return x == sentinel(); };
    return std::all_of(v_.begin(), v_.begin() + kGuard, is) &&
           std::all_of(v_.end() - kGuard, v_.end(), is);
  }
  static constexpr int64_t kGuard = 64;
  std::vector<T> v_;
};

// A kernel templated on its output type, both instantiations run on the same inputs: each
// bf16 output (uint16_t bits) is the f32 output rounded once (core/dtype.h f32_to_bf16).
inline void expect_rounded(const std::vector<uint16_t>& got, const std::vector<float>& f32,
                           const std::string& what) {
  ASSERT_EQ(got.size(), f32.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(got[i], f32_to_bf16(f32[i]).bits)
        << what << ": element " << i << " of " << got.size() << " (f32 " << f32[i] << ")";
}

inline int64_t count_nan(const std::vector<float>& x) {
  return std::count_if(x.begin(), x.end(), [](float v) { return std::isnan(v); });
}

}  // namespace mt::kernels::emu_test

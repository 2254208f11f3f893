// Helpers shared by the kernel tests: random data, a double-precision central finite
// difference, and element-wise comparison with a tolerance.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/bf16_tiles.h"

namespace mt::kernels::test {

inline std::vector<float> randn(int64_t n, uint32_t seed, float std_dev = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, std_dev);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(gen);
  return v;
}

// The hand-written AVX512-BF16 kernels (bf16_tiles.h, bf16_packed.h) run only where the CPU
// has AVX512-BF16 and no AMX: their tests skip elsewhere, saying so.
#define SKIP_WITHOUT_BF16_TILES()            \
  if (!::mt::kernels::tiles::cpu_supports()) \
  GTEST_SKIP() << "this CPU has no AVX512-BF16 (or has AMX): not run here"

// bf16 as a double (exact).
inline double as_double(bf16 x) { return bf16_to_f32(x); }

// x rounded to bf16 (to nearest even, as kernels::to_bf16): the operands of the bf16 kernels.
inline std::vector<bf16> rounded(const std::vector<float>& x) {
  std::vector<bf16> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = f32_to_bf16(x[i]);
  return y;
}

inline std::vector<double> to_double(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// Central differences of a scalar function of x, in double: with h = 1e-6 the truncation
// error is O(h^2 f''') ~ 1e-12 and the rounding error O(eps_double / h) ~ 1e-10, both far
// below the float tolerances the kernels are held to.
template <class F>
std::vector<double> numeric_grad(std::vector<double> x, F&& f, double h = 1e-6) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double fp = f(x);
    x[i] = x0 - h;
    const double fm = f(x);
    x[i] = x0;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

// |got - want| <= atol + rtol * |want| for every element.
inline void expect_close(const float* got, const double* want, size_t n, double atol, double rtol,
                         const char* what) {
  int bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= atol + rtol * std::fabs(want[i]))) {
      if (++bad <= 5)
        ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i] << " (err "
                      << err << ")";
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << n << " elements out of tolerance";
}

inline void expect_close(const std::vector<float>& got, const std::vector<double>& want,
                         double atol, double rtol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  expect_close(got.data(), want.data(), got.size(), atol, rtol, what);
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace mt::kernels::test

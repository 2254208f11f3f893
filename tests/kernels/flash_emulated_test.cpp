// The fused attention's CUDA kernels, their real source (kernels/cuda/
// flash_attention_kernels.cuh), run on the CPU under the host emulation of
// kernels/cuda_emu/cuda_emu.h, through the launches flash_attention.cu makes (the forward;
// then the backward's three kernels, the first one writing D), against the CPU attention
// kernel, the oracle. It needs neither nvcc nor a GPU, so every build runs it (CI included):
// it checks the tiling, the causal mask and the rows past T, the online softmax, the backward's
// recomputation and its D rows, the shared-memory carving (WMMA alignment, leading dims and
// bounds; under ASan every byte), the barriers (under TSan, any race they leave), and that every
// output element is written once. It cannot check the tensor cores' own arithmetic and
// fragment layouts, nor the host side (cudaFuncSetAttribute, the grid, streams):
// cuda_flash_test does, on a GPU.
//
// Tolerance: the GPU test's, relative norm ||emulated - cpu|| / ||cpu|| <= 2e-2 for out, lse
// and each of dq, dk, dv (cuda_flash_test.cpp derives it from the bf16 rounding of the
// operands: out near 3e-3, the backward near 1e-2). The emulation rounds as the kernels do
// (to bf16 before every product, f32 sums) and measured, on the shapes below, out <= 2.7e-3,
// lse <= 3.3e-3, dq and dk <= 4.5e-3, dv <= 2.9e-3: 2e-2 leaves a factor of ~4. A wrong mask,
// a wrong WMMA layout or a missing barrier gave errors of order 1 or NaN.
//
// Shapes: every head dim (32, 64, 128), T = 1, T within one tile, T past a tile boundary (2
// and 3 tiles, the last one partial), B and NH above 1. Kept small: the 128 threads of a
// block are fibers that switch at every barrier (about 1 us a switch, far more under TSan).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cuda_test_util.h"
#include "kernels/kernels.h"
#include "kernels/test_util.h"

// The emulator first: it defines the CUDA names the kernels' header uses.
#include "kernels/cuda_emu/cuda_emu.h"
// (A block of its own, so that sorting the includes keeps this order.)
#include "kernels/cuda/flash_attention_kernels.cuh"

namespace mt::kernels {
namespace {

namespace fa = cuda::detail;
namespace emu = cuda_emu;
using test::bitwise_equal;
using test::norm;
using test::part_of;
using test::randn;
using test::rel_norm;

constexpr double kBf16Attention = 2e-2;  // see the top of the file

struct Shape {
  int64_t B, NH, T;
};

std::string name_of(int hd, const Shape& s) {
  return "flash (emulated) hd=" + std::to_string(hd) + " B=" + std::to_string(s.B) +
         " NH=" + std::to_string(s.NH) + " T=" + std::to_string(s.T);
}

// An output buffer: n NaNs (the poison: an element never written stays NaN) between two guard
// zones of a sentinel value (a write just outside the buffer changes one).
class Guarded {
 public:
  explicit Guarded(int64_t n)
      : v_(static_cast<size_t>(n + 2 * kGuard), std::numeric_limits<float>::quiet_NaN()) {
    std::fill_n(v_.begin(), kGuard, kSentinel);
    std::fill_n(v_.end() - kGuard, kGuard, kSentinel);
  }
  float* get() { return v_.data() + kGuard; }
  std::vector<float> values() const { return {v_.begin() + kGuard, v_.end() - kGuard}; }
  bool guards_intact() const {
    return std::all_of(v_.begin(), v_.begin() + kGuard, [](float x) { return x == kSentinel; }) &&
           std::all_of(v_.end() - kGuard, v_.end(), [](float x) { return x == kSentinel; });
  }

 private:
  static constexpr int64_t kGuard = 256;
  static constexpr float kSentinel = 12345.0f;
  std::vector<float> v_;
};

struct FlashResult {
  std::vector<float> out, lse, dqkv, d_rows;
};

// flash_attention_forward then flash_attention_backward as flash_attention.cu launches them
// (forward_hd, backward_hd): the same kernels, grids, block size and shared-memory bytes.
template <int HD>
FlashResult run_flash(const std::vector<float>& qkv, const std::vector<float>& dout,
                      const Shape& s) {
  const int64_t C = s.NH * HD, n_out = s.B * s.T * C, n_rows = s.B * s.NH * s.T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  const emu::Dim3 grid{static_cast<unsigned>(s.B * s.NH),
                       static_cast<unsigned>((s.T + fa::kTile - 1) / fa::kTile), 1};
  const int t = static_cast<int>(s.T), nh = static_cast<int>(s.NH);
  using D = fa::Dims<HD>;
  Guarded out(n_out), lse(n_rows), dqkv(3 * n_out), d_rows(n_rows);

  emu::launch(fa::flash_forward_kernel<HD, false>, grid, fa::kFlashThreads, D::kForwardBytes,
              out.get(), lse.get(), nullptr, nullptr, nullptr, qkv.data(), t, nh, C, scale);
  emu::launch(fa::flash_forward_kernel<HD, true>, grid, fa::kFlashThreads, D::kForwardBytes,
              nullptr, nullptr, d_rows.get(), lse.get(), dout.data(), qkv.data(), t, nh, C, scale);
  emu::launch(fa::flash_backward_kv_kernel<HD>, grid, fa::kFlashThreads, D::kKvBytes, dqkv.get(),
              dout.data(), qkv.data(), lse.get(), d_rows.get(), t, nh, C, scale);
  emu::launch(fa::flash_backward_q_kernel<HD>, grid, fa::kFlashThreads, D::kQBytes, dqkv.get(),
              dout.data(), qkv.data(), lse.get(), d_rows.get(), t, nh, C, scale);

  EXPECT_TRUE(out.guards_intact()) << "a write outside out";
  EXPECT_TRUE(lse.guards_intact()) << "a write outside lse";
  EXPECT_TRUE(dqkv.guards_intact()) << "a write outside dqkv";
  EXPECT_TRUE(d_rows.guards_intact()) << "a write outside d_rows";
  return {out.values(), lse.values(), dqkv.values(), d_rows.values()};
}

int64_t count_nan(const std::vector<float>& x) {
  return std::count_if(x.begin(), x.end(), [](float v) { return std::isnan(v); });
}

template <int HD>
void check_against_cpu(const Shape& s, uint32_t seed) {
  const std::string what = name_of(HD, s);
  SCOPED_TRACE(what);
  const int64_t C = s.NH * HD, n_qkv = s.B * s.T * 3 * C, n_out = s.B * s.T * C;
  const auto qkv = randn(n_qkv, seed), dout = randn(n_out, seed + 1);

  // The oracle: the CPU kernel (and lse in double).
  std::vector<float> out(n_out), att(attention_stash_elems(s.B, s.NH, s.T)), dqkv(n_qkv),
      scratch(attention_scratch_elems(s.B, s.NH, s.T));
  attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, C, s.NH);
  attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), s.B, s.T, C,
                     s.NH);
  const auto lse = test::reference_lse(qkv, s.B, s.T, s.NH * HD, s.NH);

  const FlashResult got = run_flash<HD>(qkv, dout, s);
  // Every element written: none of the NaN poison is left.
  EXPECT_EQ(count_nan(got.out), 0) << what << " out";
  EXPECT_EQ(count_nan(got.lse), 0) << what << " lse";
  EXPECT_EQ(count_nan(got.dqkv), 0) << what << " dqkv";
  EXPECT_EQ(count_nan(got.d_rows), 0) << what << " d_rows";
  MT_EXPECT_REL(got.out, out, kBf16Attention, what + " out");
  MT_EXPECT_REL(got.lse, lse, kBf16Attention, what + " lse");
  const char* names[3] = {" dq", " dk", " dv"};
  const double dv_norm = norm(part_of(dqkv, s.B * s.T, C, 2));
  for (int part = 0; part < 3; ++part) {
    const auto g = part_of(got.dqkv, s.B * s.T, C, part), w = part_of(dqkv, s.B * s.T, C, part);
    if (norm(w) > 0) {
      MT_EXPECT_REL(g, w, kBf16Attention, what + names[part]);
    } else {
      // T = 1: one key, the CPU's dq and dk are exactly 0; the kernels get dP - D from two
      // differently ordered f32 sums of the same bf16 products (as cuda_flash_test explains).
      EXPECT_LE(norm(g), kBf16Attention * dv_norm) << what << names[part];
    }
  }

  // Deterministic: a second run gives the same bits, whatever the threads' schedule was.
  const FlashResult again = run_flash<HD>(qkv, dout, s);
  EXPECT_TRUE(bitwise_equal(again.out, got.out)) << what << " out differs between runs";
  EXPECT_TRUE(bitwise_equal(again.lse, got.lse)) << what << " lse differs between runs";
  EXPECT_TRUE(bitwise_equal(again.dqkv, got.dqkv)) << what << " dqkv differs between runs";
  EXPECT_TRUE(bitwise_equal(again.d_rows, got.d_rows)) << what << " d_rows differs between runs";
}

TEST(FlashEmulated, HeadDim32) {
  check_against_cpu<32>({2, 2, 1}, 100);   // T = 1, B and NH above 1
  check_against_cpu<32>({1, 2, 70}, 110);  // 2 tiles, the second of 6 rows
}

TEST(FlashEmulated, HeadDim64) {
  check_against_cpu<64>({2, 1, 7}, 200);    // within one tile
  check_against_cpu<64>({1, 1, 129}, 210);  // 3 tiles, the last of 1 row
}

TEST(FlashEmulated, HeadDim128) {
  check_against_cpu<128>({1, 2, 100}, 300);  // 2 tiles, the second partial
}

}  // namespace
}  // namespace mt::kernels

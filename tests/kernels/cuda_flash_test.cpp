// The fused (flash) CUDA attention against the CPU kernel, the oracle, with the fused path
// on for the test's thread (detail::set_flash_attention; off is a thread's default).
//
// Tolerance: relative norm ||gpu - cpu|| / ||cpu|| <= 2e-2 for out, lse and each of dq, dk,
// dv. The fused kernels round q, k, v, dO, and the probabilities P and dS, to bf16 (8
// significant bits, a relative rounding error up to 2^-8 = 3.9e-3 per operand) before every
// tensor-core product, accumulating in f32; a product of two rounded operands is off by up
// to ~2^-7 relative per term, and the errors of the terms of a sum partly cancel, so out
// lands near 3e-3; the backward chains up to three rounded products (dP from rounded dO and
// V, dS rounded, then dS K), near 1e-2. A host emulation of the kernels' loops with bf16
// rounding (same shapes and inputs of this kind) measured out 1.6e-3 .. 2.9e-3, lse <=
// 3.1e-3, dq and dk <= 4.2e-3, dv <= 3.1e-3; a second one (these kernels' own code on host
// threads, 8 seeds at T = 7) dq and dk <= 4.6e-3. 2e-2 leaves a factor of ~4 over that, and
// is still far below what a wrong mask, a wrong tile or a missed rescale gives (order 1).
#include <gtest/gtest.h>

#if MESHTRAIN_CUDA

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda_test_util.h"
#include "kernels/kernels.h"
#include "kernels/test_util.h"

namespace mt::kernels {
namespace {

using test::bitwise_equal;
using test::Gpu;
using test::norm;
using test::OnGpu;
using test::part_of;
using test::randn;

constexpr double kBf16Attention = 2e-2;  // see the top of the file

// Forces the fused path on (or off) while it lives.
struct FlashMode {
  explicit FlashMode(bool on) { cuda::detail::set_flash_attention(on); }
  ~FlashMode() { cuda::detail::set_flash_attention(false); }
  FlashMode(const FlashMode&) = delete;
  FlashMode& operator=(const FlashMode&) = delete;
};

TEST(CudaFlashAttention, MatchesCpuAndIsDeterministic) {
  MT_REQUIRE_GPU();
  const int64_t B = 2, NH = 3;
  uint32_t seed = 900;
  for (const int64_t hd : {32, 64, 128}) {
    for (const int64_t T : {1, 7, 64, 100, 257}) {
      const int64_t C = NH * hd, n_qkv = B * T * 3 * C, n_out = B * T * C, n_rows = B * NH * T;
      const std::string what =
          "flash attention hd=" + std::to_string(hd) + " T=" + std::to_string(T);
      SCOPED_TRACE(what);
      const auto qkv = randn(n_qkv, seed++), dout = randn(n_out, seed++);
      // The CPU oracle (this thread is still on the CPU: T*T stash and scratch).
      std::vector<float> out(n_out), att(attention_stash_elems(B, NH, T)), dqkv(n_qkv),
          scratch(attention_scratch_elems(B, NH, T));
      attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
      attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B, T, C,
                         NH);
      const auto lse = test::reference_lse(qkv, B, T, C, NH);

      OnGpu g;
      FlashMode flash(true);
      ASSERT_EQ(attention_stash_elems(B, NH, T), n_rows);
      ASSERT_EQ(attention_scratch_elems(B, NH, T), n_rows);
      Gpu<float> gqkv(qkv), gdout(dout);
      auto gout = Gpu<float>::poisoned(n_out), glse = Gpu<float>::poisoned(n_rows),
           gdqkv = Gpu<float>::poisoned(n_qkv), gscr = Gpu<float>::poisoned(n_rows);
      attention_forward(gout.get(), glse.get(), gqkv.get(), B, T, C, NH);
      attention_backward(gdqkv.get(), gscr.get(), gdout.get(), gqkv.get(), glse.get(), B, T, C, NH);
      const auto got_out = gout.host(), got_lse = glse.host(), got_dqkv = gdqkv.host();
      // Every element written: a NaN left from the poison fails rel_norm.
      MT_EXPECT_REL(got_out, out, kBf16Attention, what + " out");
      MT_EXPECT_REL(got_lse, lse, kBf16Attention, what + " lse");
      const char* names[3] = {" dq", " dk", " dv"};
      const double dv_norm = norm(part_of(dqkv, B * T, C, 2));
      for (int part = 0; part < 3; ++part) {
        const auto got = part_of(got_dqkv, B * T, C, part), want = part_of(dqkv, B * T, C, part);
        if (norm(want) > 0) {
          MT_EXPECT_REL(got, want, kBf16Attention, what + names[part]);
        } else {
          // T = 1: one key, the softmax is constant and the CPU's dq, dk are exactly 0; the
          // fused kernels get dP - D from two differently ordered f32 sums of the same bf16
          // products, ~1e-7 relative, so anything near the gradients' own scale is a bug.
          EXPECT_LE(norm(got), kBf16Attention * dv_norm) << what << names[part];
        }
      }

      // Deterministic: the same inputs give the same bits (no atomics anywhere).
      auto gout2 = Gpu<float>::poisoned(n_out), glse2 = Gpu<float>::poisoned(n_rows),
           gdqkv2 = Gpu<float>::poisoned(n_qkv), gscr2 = Gpu<float>::poisoned(n_rows);
      attention_forward(gout2.get(), glse2.get(), gqkv.get(), B, T, C, NH);
      attention_backward(gdqkv2.get(), gscr2.get(), gdout.get(), gqkv.get(), glse2.get(), B, T, C,
                         NH);
      EXPECT_TRUE(bitwise_equal(gout2.host(), got_out)) << what << " out differs between runs";
      EXPECT_TRUE(bitwise_equal(glse2.host(), got_lse)) << what << " lse differs between runs";
      EXPECT_TRUE(bitwise_equal(gdqkv2.host(), got_dqkv)) << what << " dqkv differs between runs";
    }
  }
}

TEST(CudaFlashAttention, OffMeansThePlainSizes) {
  MT_REQUIRE_GPU();
  OnGpu g;
  FlashMode plain(false);
  EXPECT_EQ(attention_stash_elems(2, 3, 5), 2 * 3 * 5 * 5);
  EXPECT_EQ(attention_scratch_elems(2, 3, 5), 2 * 3 * 5 * 5);
  FlashMode flash(true);
  EXPECT_EQ(attention_stash_elems(2, 3, 5), 2 * 3 * 5);
  EXPECT_EQ(attention_scratch_elems(2, 3, 5), 2 * 3 * 5);
}

TEST(CudaFlashAttention, RefusesUnsupportedHeadDims) {
  MT_REQUIRE_GPU();
  OnGpu g;
  FlashMode flash(true);
  // hd = 48: the stash was sized for the fused path, so falling back is not an option.
  Gpu<float> qkv(std::vector<float>(3 * 4 * 96)), out(std::vector<float>(4 * 96)),
      lse(std::vector<float>(2 * 4));
  EXPECT_THROW(attention_forward(out.get(), lse.get(), qkv.get(), 1, 4, 96, 2), Error);
}

}  // namespace
}  // namespace mt::kernels

#else

TEST(CudaFlashAttention, NeedsTheCudaBuild) {
  GTEST_SKIP() << "built without MESHTRAIN_CUDA: the fused attention is not compiled";
}

#endif

// The CUDA kernels (kernels/cuda) against the CPU kernels, the oracle: each test computes the
// reference on the CPU, then the same call with the thread on GPU 0 (the public kernels
// dispatch to kernels::cuda), on random inputs of several shapes including odd ones.
// Outputs are poisoned with NaN before the GPU runs (an element the kernel forgets fails),
// and accumulated gradients start from random values (+= versus overwrite).
//
// Tolerances (relative norm ||gpu - cpu|| / ||cpu||):
//  - f32 kernels 1e-5: both sides compute in f32 and differ only in summation order and
//    in exp (the CPU's fast_exp and CUDA's expf are each within ~2 ulp), a few 1e-7 per
//    element; backward passes that chain several GEMMs get 3e-5.
//  - bf16-operand GEMMs with f32 output 1e-3: the same bf16 inputs on both sides and f32
//    accumulation, so again only the order of additions (tensor cores).
//  - bf16-rounded outputs 1e-2: an f32 difference of ~1e-7 can flip the rounding of an
//    element by one bf16 ulp (2^-8 relative).
//  - kernels that add in the CPU's order (embedding and position backward, AdamW) 1e-6.
//  - double reductions (sum, sum_squares) 1e-12: products are exact in double, only the
//    order of double additions differs.
#include <gtest/gtest.h>

#if MESHTRAIN_CUDA

#include <cmath>
#include <limits>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda_test_util.h"
#include "kernels/kernels.h"
#include "kernels/mixed.h"
#include "kernels/test_util.h"
#include "kernels/vocab_parallel.h"

namespace mt::kernels {
namespace {

using test::bitwise_equal;
using test::Gpu;
using test::OnGpu;
using test::randn;
using test::random_tokens;

constexpr double kF32 = 1e-5;
constexpr double kF32Chain = 3e-5;
constexpr double kBf16 = 1e-3;
constexpr double kBf16Out = 1e-2;
constexpr double kOrdered = 1e-6;

// ---- GEMM ---------------------------------------------------------------------------------

struct GemmShape {
  int64_t M, N, K;
};

TEST(CudaKernels, GemmMatchesCpuAllTransposes) {
  MT_REQUIRE_GPU();
  const GemmShape shapes[] = {{1, 1, 1}, {7, 5, 3}, {13, 24, 17}, {64, 48, 96}, {33, 130, 65}};
  uint32_t seed = 1;
  for (const auto& s : shapes)
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (float beta : {0.0f, 0.5f}) {
          // Leading dims with padding (+3) to catch a layout mix-up.
          const int64_t lda = (ta ? s.M : s.K) + 3, ldb = (tb ? s.K : s.N) + 3, ldc = s.N + 2;
          const auto A = randn((ta ? s.K : s.M) * lda, seed++);
          const auto B = randn((tb ? s.N : s.K) * ldb, seed++);
          const auto C0 = randn(s.M * ldc, seed++);
          auto want = C0;
          gemm(ta, tb, s.M, s.N, s.K, 0.7f, A.data(), lda, B.data(), ldb, beta, want.data(), ldc);
          std::vector<float> got;
          {
            OnGpu g;
            Gpu<float> a(A), b(B);
            // beta == 0 must not read C: poison it.
            Gpu<float> c = beta == 0.0f ? Gpu<float>::poisoned(s.M * ldc) : Gpu<float>(C0);
            gemm(ta, tb, s.M, s.N, s.K, 0.7f, a.get(), lda, b.get(), ldb, beta, c.get(), ldc);
            got = c.host();
          }
          // Only the M x N block is defined when C was poisoned.
          std::vector<float> g2, w2;
          for (int64_t i = 0; i < s.M; ++i)
            for (int64_t j = 0; j < s.N; ++j) {
              g2.push_back(got[i * ldc + j]);
              w2.push_back(want[i * ldc + j]);
            }
          MT_EXPECT_REL(g2, w2, kF32,
                        "gemm M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) +
                            " K=" + std::to_string(s.K) + " ta=" + std::to_string(ta) +
                            " tb=" + std::to_string(tb) + " beta=" + std::to_string(beta));
        }
}

TEST(CudaKernels, GemmWithEmptyReductionScalesC) {
  MT_REQUIRE_GPU();
  const auto C0 = randn(6, 3);
  std::vector<float> got;
  {
    OnGpu g;
    Gpu<float> c(C0);
    Gpu<float> dummy(std::vector<float>(4, 1.0f));
    gemm(false, false, 2, 3, 0, 1.0f, dummy.get(), 1, dummy.get(), 3, 0.5f, c.get(), 3);
    got = c.host();
  }
  for (size_t i = 0; i < C0.size(); ++i) EXPECT_EQ(got[i], 0.5f * C0[i]);
}

TEST(CudaKernels, GemmBf16MatchesCpu) {
  MT_REQUIRE_GPU();
  const GemmShape shapes[] = {{7, 5, 3}, {13, 24, 17}, {64, 48, 96}};
  uint32_t seed = 100;
  for (const auto& s : shapes)
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        const int64_t lda = ta ? s.M : s.K, ldb = tb ? s.K : s.N;
        const auto A = test::to_bf16_host(randn((ta ? s.K : s.M) * lda, seed++));
        const auto B = test::to_bf16_host(randn((tb ? s.N : s.K) * ldb, seed++));
        const auto C0 = randn(s.M * s.N, seed++);
        auto want = C0;
        gemm_bf16(ta, tb, s.M, s.N, s.K, 1.0f, A.data(), lda, B.data(), ldb, 1.0f, want.data(),
                  s.N);
        std::vector<float> got;
        {
          OnGpu g;
          Gpu<bf16> a(A), b(B);
          Gpu<float> c(C0);
          gemm_bf16(ta, tb, s.M, s.N, s.K, 1.0f, a.get(), lda, b.get(), ldb, 1.0f, c.get(), s.N);
          got = c.host();
        }
        MT_EXPECT_REL(got, want, kBf16, "gemm_bf16 M=" + std::to_string(s.M));
      }
}

TEST(CudaKernels, GemmBatchedMatchesCpu) {
  MT_REQUIRE_GPU();
  // Interleaved operands like attention's heads: matrices `hd` apart inside wider rows.
  const int64_t batch = 3, M = 13, N = 8, K = 11, ld_a = batch * K + 5, ld_b = batch * N + 1,
                ld_c = batch * N + 2;
  const auto A = randn(M * ld_a, 7);
  const auto B = randn(K * ld_b, 8);
  const auto C0 = randn(M * ld_c, 9);
  auto want = C0;
  gemm_batched(false, false, M, N, K, 1.25f, A.data(), ld_a, K, B.data(), ld_b, N, 0.0f,
               want.data(), ld_c, N, batch);
  std::vector<float> got;
  {
    OnGpu g;
    Gpu<float> a(A), b(B), c(C0);
    gemm_batched(false, false, M, N, K, 1.25f, a.get(), ld_a, K, b.get(), ld_b, N, 0.0f, c.get(),
                 ld_c, N, batch);
    got = c.host();
  }
  MT_EXPECT_REL(got, want, kF32, "gemm_batched interleaved");

  // Contiguous matrices, transposed operands, beta = 1.
  const int64_t bs = 4, m = 9, n = 7, k = 5;
  const auto A2 = randn(bs * k * m, 10), B2 = randn(bs * n * k, 11), C2 = randn(bs * m * n, 12);
  auto want2 = C2;
  gemm_batched(true, true, m, n, k, 1.0f, A2.data(), m, k * m, B2.data(), k, n * k, 1.0f,
               want2.data(), n, m * n, bs);
  std::vector<float> got2;
  {
    OnGpu g;
    Gpu<float> a(A2), b(B2), c(C2);
    gemm_batched(true, true, m, n, k, 1.0f, a.get(), m, k * m, b.get(), k, n * k, 1.0f, c.get(), n,
                 m * n, bs);
    got2 = c.host();
  }
  MT_EXPECT_REL(got2, want2, kF32, "gemm_batched transposed");
}

// ---- linear ---------------------------------------------------------------------------------

TEST(CudaKernels, LinearForwardBackwardMatchCpu) {
  MT_REQUIRE_GPU();
  struct S {
    int64_t n, in, out;
  };
  for (const S s : {S{7, 24, 13}, S{32, 64, 48}, S{1, 3, 5}})
    for (bool bias : {true, false}) {
      const auto x = randn(s.n * s.in, 20), w = randn(s.out * s.in, 21), b = randn(s.out, 22);
      const auto dy = randn(s.n * s.out, 23), dw0 = randn(s.out * s.in, 24), db0 = randn(s.out, 25);
      std::vector<float> y(s.n * s.out), dx(s.n * s.in), dw = dw0, db = db0;
      linear_forward(y.data(), x.data(), w.data(), bias ? b.data() : nullptr, s.n, s.in, s.out);
      linear_backward(dx.data(), dw.data(), bias ? db.data() : nullptr, dy.data(), x.data(),
                      w.data(), s.n, s.in, s.out);
      OnGpu g;
      Gpu<float> gx(x), gw(w), gb(b), gdy(dy), gdw(dw0), gdb(db0);
      auto gy = Gpu<float>::poisoned(s.n * s.out), gdx = Gpu<float>::poisoned(s.n * s.in);
      linear_forward(gy.get(), gx.get(), gw.get(), bias ? gb.get() : nullptr, s.n, s.in, s.out);
      linear_backward(gdx.get(), gdw.get(), bias ? gdb.get() : nullptr, gdy.get(), gx.get(),
                      gw.get(), s.n, s.in, s.out);
      MT_EXPECT_REL(gy.host(), y, kF32, "linear y");
      MT_EXPECT_REL(gdx.host(), dx, kF32, "linear dx");
      MT_EXPECT_REL(gdw.host(), dw, kF32, "linear dw (accumulated)");
      MT_EXPECT_REL(gdb.host(), db, kF32, "linear db (accumulated)");
      // dx may be null; the bias gradient is deterministic.
      Gpu<float> gdb2(db0);
      linear_backward(nullptr, gdw.get(), gdb2.get(), gdy.get(), gx.get(), gw.get(), s.n, s.in,
                      s.out);
      Gpu<float> gdb3(db0);
      linear_backward(nullptr, nullptr, gdb3.get(), gdy.get(), gx.get(), gw.get(), s.n, s.in,
                      s.out);
      EXPECT_TRUE(bitwise_equal(gdb2.host(), gdb3.host())) << "linear db not deterministic";
    }
}

// ---- layer norm -----------------------------------------------------------------------------

TEST(CudaKernels, LayerNormMatchesCpuAndIsDeterministic) {
  MT_REQUIRE_GPU();
  struct S {
    int64_t n, c;
  };
  // c below, at and far above the block of 256 and not a multiple of 4 (1000, 4099); n=1001,
  // c=7 splits the dw/db rows into 251 chunks of 4 rows whose last chunk has 1 row.
  for (const S s : {S{7, 24}, S{13, 768}, S{5, 1000}, S{300, 3}, S{1001, 7}, S{3, 4099}})
    for (bool bias : {true, false}) {
      const int64_t nc = s.n * s.c;
      auto x = randn(nc, 30, 2.0f);
      for (int64_t i = 0; i < nc; ++i) x[i] += 0.5f;  // a non-zero mean
      const auto w = randn(s.c, 31), b = randn(s.c, 32), dy = randn(nc, 33);
      const auto dx0 = randn(nc, 34), dw0 = randn(s.c, 35), db0 = randn(s.c, 36);
      std::vector<float> y(nc), mean(s.n), rstd(s.n), dx = dx0, dw = dw0, db = db0;
      layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(),
                        bias ? b.data() : nullptr, s.n, s.c);
      layernorm_backward(dx.data(), dw.data(), bias ? db.data() : nullptr, dy.data(), x.data(),
                         w.data(), mean.data(), rstd.data(), s.n, s.c);
      OnGpu g;
      Gpu<float> gx(x), gw(w), gb(b), gdy(dy);
      auto gy = Gpu<float>::poisoned(nc), gm = Gpu<float>::poisoned(s.n),
           gr = Gpu<float>::poisoned(s.n);
      layernorm_forward(gy.get(), gm.get(), gr.get(), gx.get(), gw.get(), bias ? gb.get() : nullptr,
                        s.n, s.c);
      MT_EXPECT_REL(gy.host(), y, kF32, "layernorm y");
      MT_EXPECT_REL(gm.host(), mean, kF32, "layernorm mean");
      MT_EXPECT_REL(gr.host(), rstd, kF32, "layernorm rstd");
      std::vector<float> first[3];
      for (int run = 0; run < 2; ++run) {
        Gpu<float> gdx(dx0), gdw(dw0), gdb(db0);
        layernorm_backward(gdx.get(), gdw.get(), bias ? gdb.get() : nullptr, gdy.get(), gx.get(),
                           gw.get(), gm.get(), gr.get(), s.n, s.c);
        std::vector<float> out[3] = {gdx.host(), gdw.host(), gdb.host()};
        if (run == 0) {
          MT_EXPECT_REL(out[0], dx, kF32Chain, "layernorm dx (accumulated)");
          MT_EXPECT_REL(out[1], dw, kF32, "layernorm dw (accumulated)");
          MT_EXPECT_REL(out[2], db, kF32, "layernorm db (accumulated)");
          for (int k = 0; k < 3; ++k) first[k] = out[k];
        } else {
          for (int k = 0; k < 3; ++k)
            EXPECT_TRUE(bitwise_equal(out[k], first[k]))
                << "layernorm_backward output " << k << " differs between two runs";
        }
      }
    }
}

// ---- GELU -----------------------------------------------------------------------------------

TEST(CudaKernels, GeluMatchesCpu) {
  MT_REQUIRE_GPU();
  for (int64_t n : {1, 7, 1000, 65537}) {
    auto x = randn(n, 40, 3.0f);
    const auto dy = randn(n, 41);
    // Tails where exp(-2u) overflows to inf (x << 0) or underflows to 0 (x >> 0): finite,
    // y -> 0 and y -> x, no NaN. Not for n = 1: alone, y(-20) is -0 on the GPU and ~1e-37
    // on the CPU (fast_exp clamps its argument at 88), a relative error of 1.
    const float tails[] = {-20.0f, -12.0f, -9.0f, 9.0f, 12.0f, 20.0f};
    if (n >= 7)
      for (size_t k = 0; k < std::size(tails); ++k) x[k] = tails[k];
    std::vector<float> y(n), dx(n);
    gelu_forward(y.data(), x.data(), n);
    gelu_backward(dx.data(), x.data(), dy.data(), n);
    OnGpu g;
    Gpu<float> gx(x), gdy(dy);
    auto gy = Gpu<float>::poisoned(n), gdx = Gpu<float>::poisoned(n);
    gelu_forward(gy.get(), gx.get(), n);
    gelu_backward(gdx.get(), gx.get(), gdy.get(), n);
    MT_EXPECT_REL(gy.host(), y, kF32, "gelu y");
    MT_EXPECT_REL(gdx.host(), dx, kF32, "gelu dx");
  }
}

// ---- attention ------------------------------------------------------------------------------

TEST(CudaKernels, AttentionMatchesCpu) {
  MT_REQUIRE_GPU();
  struct S {
    int64_t B, T, C, NH;
  };
  for (const S s :
       {S{2, 13, 24, 3}, S{1, 64, 64, 1}, S{3, 8, 32, 2}, S{2, 33, 48, 4}, S{1, 1, 8, 1}}) {
    const int64_t n_qkv = s.B * s.T * 3 * s.C, n_out = s.B * s.T * s.C;
    const auto qkv = randn(n_qkv, 50), dout = randn(n_out, 51);
    const int64_t stash = attention_stash_elems(s.B, s.NH, s.T);
    const int64_t scr = attention_scratch_elems(s.B, s.NH, s.T);
    std::vector<float> out(n_out), att(stash), dqkv(n_qkv), scratch(scr);
    attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), s.B, s.T,
                       s.C, s.NH);
    OnGpu g;
    // The plain path (a thread's default; the fused one: cuda_flash_test).
    cuda::detail::set_flash_attention(false);
    ASSERT_EQ(attention_stash_elems(s.B, s.NH, s.T), s.B * s.NH * s.T * s.T);
    ASSERT_EQ(attention_scratch_elems(s.B, s.NH, s.T), s.B * s.NH * s.T * s.T);
    Gpu<float> gqkv(qkv), gdout(dout);
    auto gout = Gpu<float>::poisoned(n_out), gatt = Gpu<float>::poisoned(stash),
         gdqkv = Gpu<float>::poisoned(n_qkv), gscr = Gpu<float>::poisoned(scr);
    attention_forward(gout.get(), gatt.get(), gqkv.get(), s.B, s.T, s.C, s.NH);
    attention_backward(gdqkv.get(), gscr.get(), gdout.get(), gqkv.get(), gatt.get(), s.B, s.T, s.C,
                       s.NH);
    const std::string what = "attention B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) +
                             " C=" + std::to_string(s.C) + " NH=" + std::to_string(s.NH);
    MT_EXPECT_REL(gout.host(), out, kF32, what + " out");
    const auto gatt_h = gatt.host();
    MT_EXPECT_REL(gatt_h, att, kF32, what + " att");
    // Above the diagonal: exactly 0.
    for (int64_t r = 0; r < s.B * s.NH * s.T; ++r)
      for (int64_t j = r % s.T + 1; j < s.T; ++j)
        ASSERT_EQ(gatt_h[r * s.T + j], 0.0f) << what << " att row " << r << " col " << j;
    MT_EXPECT_REL(gdqkv.host(), dqkv, kF32Chain, what + " dqkv");
  }
}

TEST(CudaKernels, AttentionRejectsBadShapes) {
  MT_REQUIRE_GPU();
  OnGpu g;
  EXPECT_THROW(attention_forward(nullptr, nullptr, nullptr, 1, 4, 10, 3), Error);
  EXPECT_THROW(attention_forward(nullptr, nullptr, nullptr, 1, 0, 12, 3), Error);
}

// ---- cross-entropy --------------------------------------------------------------------------

TEST(CudaKernels, CrossEntropyMatchesCpuWithPaddedVocab) {
  MT_REQUIRE_GPU();
  struct S {
    int64_t n, V, Vp;
  };
  // V far above the block of 256 and not a multiple of it: GPT-2's 50257 padded to 50304.
  for (const S s :
       {S{7, 50, 64}, S{13, 1000, 1024}, S{4, 5, 5}, S{3, 300, 301}, S{3, 50257, 50304}}) {
    auto logits = randn(s.n * s.Vp, 60, 3.0f);
    // Padding columns hold NaN: neither side may read them (a read makes the loss NaN).
    for (int64_t i = 0; i < s.n; ++i)
      for (int64_t j = s.V; j < s.Vp; ++j)
        logits[i * s.Vp + j] = std::numeric_limits<float>::quiet_NaN();
    const auto targets = random_tokens(s.n, 0, static_cast<int32_t>(s.V), 61);
    std::vector<float> losses(s.n), lse(s.n), dl(s.n * s.Vp);
    cross_entropy_forward(losses.data(), lse.data(), logits.data(), targets.data(), s.n, s.V, s.Vp);
    cross_entropy_backward(dl.data(), logits.data(), lse.data(), targets.data(), 0.37f, s.n, s.V,
                           s.Vp);
    OnGpu g;
    Gpu<float> gl(logits);
    Gpu<int32_t> gt(targets);
    auto glosses = Gpu<float>::poisoned(s.n), glse = Gpu<float>::poisoned(s.n),
         gdl = Gpu<float>::poisoned(s.n * s.Vp);
    cross_entropy_forward(glosses.get(), glse.get(), gl.get(), gt.get(), s.n, s.V, s.Vp);
    cross_entropy_backward(gdl.get(), gl.get(), glse.get(), gt.get(), 0.37f, s.n, s.V, s.Vp);
    MT_EXPECT_REL(glosses.host(), losses, kF32, "cross_entropy losses");
    MT_EXPECT_REL(glse.host(), lse, kF32, "cross_entropy lse");
    MT_EXPECT_REL(gdl.host(), dl, kF32, "cross_entropy dlogits");
    // In place (dlogits aliases logits).
    cross_entropy_backward(gl.get(), gl.get(), glse.get(), gt.get(), 0.37f, s.n, s.V, s.Vp);
    MT_EXPECT_REL(gl.host(), dl, kF32, "cross_entropy dlogits in place");
  }
}

// ---- embeddings -----------------------------------------------------------------------------

TEST(CudaKernels, EmbeddingMatchesCpuAndIsDeterministic) {
  MT_REQUIRE_GPU();
  struct S {
    int64_t B, T, C, V;
  };
  // V small against B*T: many repeated tokens, the case the sorted backward is about.
  // V = 1: every position has the same token, one run over all positions that is also the
  // last run of the sorted keys. T = 1: dwpe is one row.
  for (const S s : {S{2, 13, 24, 10}, S{4, 64, 96, 50}, S{1, 7, 300, 3}, S{8, 128, 33, 1000},
                    S{2, 50, 40, 1}, S{5, 1, 7, 4}}) {
    const int64_t n = s.B * s.T;
    const auto tokens = random_tokens(n, 0, static_cast<int32_t>(s.V), 70);
    const auto wte = randn(s.V * s.C, 71), wpe = randn(s.T * s.C, 72), dy = randn(n * s.C, 73);
    const auto dwte0 = randn(s.V * s.C, 74), dwpe0 = randn(s.T * s.C, 75);
    std::vector<float> y(n * s.C), dwte = dwte0, dwpe = dwpe0;
    embedding_forward(y.data(), tokens.data(), wte.data(), wpe.data(), s.B, s.T, s.C);
    embedding_backward(dwte.data(), dwpe.data(), dy.data(), tokens.data(), s.B, s.T, s.C);
    OnGpu g;
    Gpu<int32_t> gt(tokens);
    Gpu<float> gwte(wte), gwpe(wpe), gdy(dy);
    auto gy = Gpu<float>::poisoned(n * s.C);
    embedding_forward(gy.get(), gt.get(), gwte.get(), gwpe.get(), s.B, s.T, s.C);
    MT_EXPECT_REL(gy.host(), y, kF32, "embedding y");
    std::vector<float> first_wte, first_wpe;
    for (int run = 0; run < 2; ++run) {
      Gpu<float> gdwte(dwte0), gdwpe(dwpe0);
      embedding_backward(gdwte.get(), gdwpe.get(), gdy.get(), gt.get(), s.B, s.T, s.C);
      const auto a = gdwte.host(), b = gdwpe.host();
      if (run == 0) {
        MT_EXPECT_REL(a, dwte, kOrdered, "embedding dwte (accumulated)");
        MT_EXPECT_REL(b, dwpe, kOrdered, "embedding dwpe (accumulated)");
        first_wte = a;
        first_wpe = b;
      } else {
        EXPECT_TRUE(bitwise_equal(a, first_wte)) << "embedding_backward dwte differs between runs";
        EXPECT_TRUE(bitwise_equal(b, first_wpe)) << "embedding_backward dwpe differs between runs";
      }
    }
    // dwpe may be null.
    Gpu<float> gdwte(dwte0);
    embedding_backward(gdwte.get(), nullptr, gdy.get(), gt.get(), s.B, s.T, s.C);
    MT_EXPECT_REL(gdwte.host(), dwte, kOrdered, "embedding dwte without dwpe");
  }
}

// ---- elementwise and reductions ------------------------------------------------------------

TEST(CudaKernels, ElementwiseAndSumsMatchCpu) {
  MT_REQUIRE_GPU();
  for (int64_t n : {1, 7, 1000, 100003}) {
    const auto a = randn(n, 80), b = randn(n, 81);
    std::vector<float> add_ab(n), acc = a, sc = a, cp(n);
    add(add_ab.data(), a.data(), b.data(), n);
    accumulate(acc.data(), b.data(), n);
    scale(sc.data(), -0.3f, n);
    copy(cp.data(), b.data(), n);
    const double ss = sum_squares(a.data(), n), s = sum(a.data(), n);
    // |sum error| <= n * eps_double * sum |a_i|, far below this bound.
    double abs_sum = 0;
    for (float v : a) abs_sum += std::fabs(v);
    OnGpu g;
    Gpu<float> ga(a), gb(b), gacc(a), gsc(a), galias(a);
    auto gadd = Gpu<float>::poisoned(n), gcp = Gpu<float>::poisoned(n);
    add(gadd.get(), ga.get(), gb.get(), n);
    add(galias.get(), galias.get(), gb.get(), n);  // y aliases a
    accumulate(gacc.get(), gb.get(), n);
    scale(gsc.get(), -0.3f, n);
    copy(gcp.get(), gb.get(), n);
    EXPECT_TRUE(bitwise_equal(gadd.host(), add_ab)) << "add";
    EXPECT_TRUE(bitwise_equal(galias.host(), add_ab)) << "add in place";
    EXPECT_TRUE(bitwise_equal(gacc.host(), acc)) << "accumulate";
    EXPECT_TRUE(bitwise_equal(gsc.host(), sc)) << "scale";
    EXPECT_TRUE(bitwise_equal(gcp.host(), cp)) << "copy";
    const double gss = sum_squares(ga.get(), n), gs = sum(ga.get(), n);
    EXPECT_NEAR(gss, ss, 1e-12 * std::fabs(ss)) << "sum_squares n=" << n;
    EXPECT_NEAR(gs, s, 1e-12 * abs_sum) << "sum n=" << n;
    // Determinism: the same bits twice.
    const double gss2 = sum_squares(ga.get(), n), gs2 = sum(ga.get(), n);
    EXPECT_EQ(std::memcmp(&gss, &gss2, sizeof(double)), 0) << "sum_squares not deterministic";
    EXPECT_EQ(std::memcmp(&gs, &gs2, sizeof(double)), 0) << "sum not deterministic";
  }
  OnGpu g;
  EXPECT_EQ(sum_squares(nullptr, 0), 0.0);
}

// ---- AdamW ----------------------------------------------------------------------------------

TEST(CudaKernels, AdamwMatchesCpu) {
  MT_REQUIRE_GPU();
  const int64_t n = 10007;
  const auto p0 = randn(n, 90), g0 = randn(n, 91, 0.1f), m0 = randn(n, 92, 0.01f);
  auto v0 = randn(n, 93, 0.001f);
  for (auto& x : v0) x = std::fabs(x);
  for (int64_t t : {1, 7}) {
    auto p = p0, m = m0, v = v0;
    adamw_update(p.data(), g0.data(), m.data(), v.data(), n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
    std::vector<float> mp, mm, mv;
    std::vector<bf16> mb(n);
    {
      auto pp = p0;
      mm = m0;
      mv = v0;
      adamw_update_mixed(pp.data(), mb.data(), g0.data(), mm.data(), mv.data(), n, 3e-4f, 0.9f,
                         0.95f, 1e-8f, 0.1f, t);
      mp = pp;
    }
    OnGpu g;
    Gpu<float> gp(p0), gg(g0), gm(m0), gv(v0);
    adamw_update(gp.get(), gg.get(), gm.get(), gv.get(), n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
    MT_EXPECT_REL(gp.host(), p, kOrdered, "adamw param");
    MT_EXPECT_REL(gm.host(), m, kOrdered, "adamw m");
    MT_EXPECT_REL(gv.host(), v, kOrdered, "adamw v");
    Gpu<float> gp2(p0), gm2(m0), gv2(v0);
    auto gb = Gpu<bf16>::poisoned(n);
    adamw_update_mixed(gp2.get(), gb.get(), gg.get(), gm2.get(), gv2.get(), n, 3e-4f, 0.9f, 0.95f,
                       1e-8f, 0.1f, t);
    const auto master = gp2.host();
    MT_EXPECT_REL(master, mp, kOrdered, "adamw_update_mixed master");
    EXPECT_TRUE(bitwise_equal(master, gp.host())) << "adamw_update_mixed master != adamw_update";
    const auto copy16 = gb.host();
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(copy16[i].bits, f32_to_bf16(master[i]).bits) << "bf16 copy of element " << i;
  }
}

TEST(CudaKernels, AdamwMultiMatchesCpuAndLeavesGapsAlone) {
  MT_REQUIRE_GPU();
  const int64_t n = 5000;
  // Gaps between segments, an empty segment, a one-element one, and one spanning many blocks.
  // The second table: a leading and a trailing empty segment (the block search must skip
  // them), and segments one element short of, exactly, and one past a block's 1024 elements.
  const auto tables = test::adamw_segment_tables();
  const auto p0 = randn(n, 94), g0 = randn(n, 95, 0.1f), m0 = randn(n, 96, 0.01f);
  auto v0 = randn(n, 97, 0.001f);
  for (auto& x : v0) x = std::fabs(x);
  for (size_t tab = 0; tab < tables.size(); ++tab) {
    const auto& segs = tables[tab];
    std::vector<bool> covered(n, false);
    for (const auto& sg : segs)
      for (int64_t i = sg.offset; i < sg.offset + sg.n; ++i) covered[i] = true;
    auto p = p0, m = m0, v = v0;
    adamw_update_multi(p.data(), g0.data(), m.data(), v.data(), segs.data(),
                       static_cast<int64_t>(segs.size()), 1e-3f, 0.9f, 0.999f, 1e-8f, 3, 0.625f);
    OnGpu g;
    Gpu<float> gg(g0);
    for (int rep = 0; rep < 2; ++rep) {  // twice: the second reuses the table buffers
      Gpu<float> gp(p0), gm(m0), gv(v0);
      adamw_update_multi(gp.get(), gg.get(), gm.get(), gv.get(), segs.data(),
                         static_cast<int64_t>(segs.size()), 1e-3f, 0.9f, 0.999f, 1e-8f, 3, 0.625f);
      const auto hp = gp.host(), hm = gm.host(), hv = gv.host();
      const std::string what = "adamw_update_multi table " + std::to_string(tab);
      MT_EXPECT_REL(hp, p, kOrdered, what + " param");
      MT_EXPECT_REL(hm, m, kOrdered, what + " m");
      MT_EXPECT_REL(hv, v, kOrdered, what + " v");
      for (int64_t i = 0; i < n; ++i)
        if (!covered[i]) {
          ASSERT_EQ(hp[i], p0[i]) << what << ": element " << i << " outside every segment changed";
        }
    }
  }
}

// ---- vocabulary-parallel kernels --------------------------------------------------------------

TEST(CudaKernels, VocabParallelMatchesCpu) {
  MT_REQUIRE_GPU();
  struct S {
    int64_t n, cols, real, v0, rows, C, T, first;
  };
  // The second shape: a slice wider than the block of 256 with a real part that is not a
  // multiple of it, C above the block, and a first row past T (the position wraps).
  for (const S sh : {S{13, 40, 33, 50, 20, 24, 8, 5}, S{40, 600, 517, 1200, 517, 300, 5, 12}}) {
    const int64_t n = sh.n, cols = sh.cols, real = sh.real, v0 = sh.v0, C = sh.C, T = sh.T;
    const auto logits = randn(n * cols, 100, 3.0f);
    // Targets inside and outside this slice [v0, v0 + real).
    const auto targets =
        random_tokens(n, static_cast<int32_t>(v0 - 20), static_cast<int32_t>(v0 + real + 20), 101);
    std::vector<float> mx(n), se(n), tl(n), sums(2 * n), lse(n), losses(n), dl(n * cols);
    vocab_parallel_max(mx.data(), logits.data(), n, cols, real);
    vocab_parallel_sum_exp(se.data(), tl.data(), logits.data(), mx.data(), targets.data(), n, cols,
                           real, v0);
    for (int64_t i = 0; i < n; ++i) sums[i] = se[i] + 1.5f, sums[n + i] = tl[i] - 0.25f;
    vocab_parallel_lse(lse.data(), losses.data(), mx.data(), sums.data(), n);
    vocab_parallel_ce_backward(dl.data(), logits.data(), lse.data(), targets.data(), 0.5f, n, cols,
                               real, v0);
    std::vector<float> mx0(n);
    vocab_parallel_max(mx0.data(), logits.data(), n, cols, 0);
    // Embeddings of a slice of rows [v0, v0 + rows).
    const int64_t rows = sh.rows;
    const auto wte = randn(rows * C, 102), dy = randn(n * C, 103), dwte0 = randn(rows * C, 104);
    // Tokens inside and outside [v0, v0 + rows), some repeated.
    const auto tok =
        random_tokens(n, static_cast<int32_t>(v0 - 10), static_cast<int32_t>(v0 + 10), 105);
    std::vector<float> ye(n * C), dwte = dwte0;
    vocab_parallel_embedding_forward(ye.data(), tok.data(), wte.data(), n, C, v0, rows);
    vocab_parallel_embedding_backward(dwte.data(), dy.data(), tok.data(), n, C, v0, rows);
    // Position embeddings over rows [first, first + m) of a microbatch, wrapping around T.
    const int64_t first = sh.first, m = 2 * T + 3;
    const auto wpe = randn(T * C, 106), yp0 = randn(m * C, 107), dyp = randn(m * C, 108),
               dwpe0 = randn(T * C, 109), bias = randn(C, 110);
    std::vector<float> yp = yp0, dwpe = dwpe0, yb = yp0;
    add_position_embedding(yp.data(), wpe.data(), first, m, T, C);
    position_embedding_backward(dwpe.data(), dyp.data(), first, m, T, C);
    add_bias(yb.data(), bias.data(), m, C);

    OnGpu g;
    Gpu<float> gl(logits), gsums(sums), gwte(wte), gdy(dy), gwpe(wpe), gdyp(dyp), gbias(bias);
    Gpu<int32_t> gt(targets), gtok(tok);
    auto gmx = Gpu<float>::poisoned(n), gse = Gpu<float>::poisoned(n),
         gtl = Gpu<float>::poisoned(n), glse = Gpu<float>::poisoned(n),
         glosses = Gpu<float>::poisoned(n), gdl = Gpu<float>::poisoned(n * cols),
         gmx0 = Gpu<float>::poisoned(n);
    vocab_parallel_max(gmx.get(), gl.get(), n, cols, real);
    vocab_parallel_max(gmx0.get(), gl.get(), n, cols, 0);
    // The rest from the CPU's mx, so each kernel is checked on its own.
    Gpu<float> gmx_cpu(mx), glse_cpu(lse);
    vocab_parallel_sum_exp(gse.get(), gtl.get(), gl.get(), gmx_cpu.get(), gt.get(), n, cols, real,
                           v0);
    vocab_parallel_lse(glse.get(), glosses.get(), gmx_cpu.get(), gsums.get(), n);
    vocab_parallel_ce_backward(gdl.get(), gl.get(), glse_cpu.get(), gt.get(), 0.5f, n, cols, real,
                               v0);
    EXPECT_TRUE(bitwise_equal(gmx.host(), mx)) << "vocab_parallel_max";
    for (float x : gmx0.host()) EXPECT_EQ(x, -std::numeric_limits<float>::infinity());
    MT_EXPECT_REL(gse.host(), se, kF32, "vocab_parallel_sum_exp sums");
    EXPECT_TRUE(bitwise_equal(gtl.host(), tl)) << "vocab_parallel_sum_exp target logits";
    MT_EXPECT_REL(glse.host(), lse, kF32, "vocab_parallel_lse lse");
    MT_EXPECT_REL(glosses.host(), losses, kF32, "vocab_parallel_lse losses");
    MT_EXPECT_REL(gdl.host(), dl, kF32, "vocab_parallel_ce_backward");
    vocab_parallel_ce_backward(gl.get(), gl.get(), glse_cpu.get(), gt.get(), 0.5f, n, cols, real,
                               v0);
    MT_EXPECT_REL(gl.host(), dl, kF32, "vocab_parallel_ce_backward in place");

    auto gye = Gpu<float>::poisoned(n * C);
    vocab_parallel_embedding_forward(gye.get(), gtok.get(), gwte.get(), n, C, v0, rows);
    EXPECT_TRUE(bitwise_equal(gye.host(), ye)) << "vocab_parallel_embedding_forward";
    std::vector<float> first_run;
    for (int run = 0; run < 2; ++run) {
      Gpu<float> gdwte(dwte0);
      vocab_parallel_embedding_backward(gdwte.get(), gdy.get(), gtok.get(), n, C, v0, rows);
      const auto h = gdwte.host();
      MT_EXPECT_REL(h, dwte, kOrdered, "vocab_parallel_embedding_backward");
      if (run == 0)
        first_run = h;
      else
        EXPECT_TRUE(bitwise_equal(h, first_run))
            << "vocab_parallel_embedding_backward not deterministic";
    }
    Gpu<float> gyp(yp0), gdwpe(dwpe0), gyb(yp0);
    add_position_embedding(gyp.get(), gwpe.get(), first, m, T, C);
    position_embedding_backward(gdwpe.get(), gdyp.get(), first, m, T, C);
    add_bias(gyb.get(), gbias.get(), m, C);
    EXPECT_TRUE(bitwise_equal(gyp.host(), yp)) << "add_position_embedding";
    MT_EXPECT_REL(gdwpe.host(), dwpe, kOrdered, "position_embedding_backward");
    EXPECT_TRUE(bitwise_equal(gyb.host(), yb)) << "add_bias";
  }
}

// ---- mixed precision --------------------------------------------------------------------------

TEST(CudaKernels, Bf16ConversionsAreBitwiseTheCpus) {
  MT_REQUIRE_GPU();
  const auto x = test::bf16_conversion_inputs();
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<bf16> want(n);
  to_bf16(want.data(), x.data(), n);
  std::vector<float> back(n);
  to_f32(back.data(), want.data(), n);
  OnGpu g;
  Gpu<float> gx(x);
  auto gy = Gpu<bf16>::poisoned(n);
  to_bf16(gy.get(), gx.get(), n);
  const auto got = gy.host();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i].bits, want[i].bits) << "to_bf16 of " << x[i];
  auto gf = Gpu<float>::poisoned(n);
  to_f32(gf.get(), gy.get(), n);
  const auto gback = gf.host();
  EXPECT_EQ(std::memcmp(gback.data(), back.data(), n * sizeof(float)), 0) << "to_f32";
}

TEST(CudaKernels, MixedLinearMatchesCpu) {
  MT_REQUIRE_GPU();
  struct S {
    int64_t n, in, out;
  };
  for (const S s : {S{7, 24, 13}, S{32, 64, 48}, S{9, 16, 40}})
    for (bool bias : {true, false}) {
      const auto x = test::to_bf16_host(randn(s.n * s.in, 130));
      const auto w = test::to_bf16_host(randn(s.out * s.in, 131));
      const auto b = randn(s.out, 132), dy = randn(s.n * s.out, 133);
      const auto dw0 = randn(s.out * s.in, 134), db0 = randn(s.out, 135);
      const float* bp = bias ? b.data() : nullptr;
      std::vector<float> y(s.n * s.out), dx(s.n * s.in), dw = dw0, db = db0;
      std::vector<bf16> y16(s.n * s.out), ws(s.n * s.out);
      linear_forward_mixed(y.data(), x.data(), w.data(), bp, s.n, s.in, s.out);
      linear_forward_mixed(y16.data(), x.data(), w.data(), bp, s.n, s.in, s.out);
      linear_backward_mixed(dx.data(), dw.data(), bias ? db.data() : nullptr, dy.data(), x.data(),
                            w.data(), s.n, s.in, s.out, ws.data(), s.n * s.out);
      OnGpu g;
      Gpu<bf16> gx(x), gw(w);
      Gpu<float> gb(b), gdy(dy);
      auto gy = Gpu<float>::poisoned(s.n * s.out);
      auto gy16 = Gpu<bf16>::poisoned(s.n * s.out);
      linear_forward_mixed(gy.get(), gx.get(), gw.get(), bias ? gb.get() : nullptr, s.n, s.in,
                           s.out);
      linear_forward_mixed(gy16.get(), gx.get(), gw.get(), bias ? gb.get() : nullptr, s.n, s.in,
                           s.out);
      MT_EXPECT_REL(gy.host(), y, kBf16, "linear_forward_mixed f32 y");
      MT_EXPECT_REL(test::bf16_to_f32_host(gy16.host()), test::bf16_to_f32_host(y16), kBf16Out,
                    "linear_forward_mixed bf16 y");
      // One pass (ws holds all of dy) and row chunks of 3 rows.
      for (int64_t ws_elems : {s.n * s.out, 3 * s.out}) {
        Gpu<float> gdw(dw0), gdb(db0);
        auto gdx = Gpu<float>::poisoned(s.n * s.in);
        auto gws = Gpu<bf16>::poisoned(ws_elems);
        linear_backward_mixed(gdx.get(), gdw.get(), bias ? gdb.get() : nullptr, gdy.get(), gx.get(),
                              gw.get(), s.n, s.in, s.out, gws.get(), ws_elems);
        const std::string what = "linear_backward_mixed ws_elems=" + std::to_string(ws_elems);
        MT_EXPECT_REL(gdx.host(), dx, kBf16, what + " dx");
        MT_EXPECT_REL(gdw.host(), dw, kBf16, what + " dw (accumulated)");
        MT_EXPECT_REL(gdb.host(), db, kF32, what + " db (accumulated, from f32 dy)");
      }
    }
}

// in == 0 (an empty reduction): the CPU gives y = b; the GPU's GEMM once refused the zero
// leading dims this passes down.
TEST(CudaKernels, MixedLinearWithEmptyReductionIsTheBias) {
  MT_REQUIRE_GPU();
  const int64_t n = 3, out = 5;
  const auto b = randn(out, 140);
  std::vector<float> y(n * out);
  std::vector<bf16> y16(n * out);
  linear_forward_mixed(y.data(), nullptr, nullptr, b.data(), n, 0, out);
  linear_forward_mixed(y16.data(), nullptr, nullptr, b.data(), n, 0, out);
  OnGpu g;
  Gpu<float> gb(b);
  auto gy = Gpu<float>::poisoned(n * out);
  auto gy16 = Gpu<bf16>::poisoned(n * out);
  linear_forward_mixed(gy.get(), nullptr, nullptr, gb.get(), n, 0, out);
  linear_forward_mixed(gy16.get(), nullptr, nullptr, gb.get(), n, 0, out);
  EXPECT_TRUE(bitwise_equal(gy.host(), y)) << "f32 y";
  EXPECT_TRUE(bitwise_equal(test::bf16_to_f32_host(gy16.host()), test::bf16_to_f32_host(y16)))
      << "bf16 y";
}

// ---- GEMM peak --------------------------------------------------------------------------------

TEST(CudaKernels, TimeGemmFlopsIsPositive) {
  MT_REQUIRE_GPU();
  OnGpu g;
  for (bool b16 : {false, true}) {
    const double f = cuda::time_gemm_flops(512, b16, 3);
    EXPECT_TRUE(std::isfinite(f) && f > 1e9)
        << (b16 ? "bf16" : "f32") << " GEMM at " << f << " FLOP/s";
  }
}

}  // namespace
}  // namespace mt::kernels

#else  // a build without CUDA

TEST(CudaKernels, Skipped) {
  GTEST_SKIP() << "built without CUDA: the CUDA kernels are not compiled";
}

#endif

// The CUDA kernels of the Llama-family parts (kernels/cuda/llama.cu) on a GPU against the CPU
// kernels, the oracle, through the public kernels (the thread on GPU 0 dispatches to
// kernels::cuda), as cuda_kernels_test does for the others: outputs poisoned with NaN,
// accumulated gradients starting from random values, odd shapes, and each kernel run twice
// for bitwise determinism. cuda_llama_emulated_test checks the same kernels' indexing on the
// CPU in every build; this one checks the GPU's arithmetic, and needs one.
//
// Tolerances (cuda_kernels_test's, relative norm): 1e-5 for RMSNorm (a block-tree row sum
// against the CPU's sequential one), SwiGLU (CUDA's expf against the CPU's fast_exp, each
// within ~2 ulp) and the rotation (FMA contraction); the kv-head copies and sums, added in the
// CPU's order, bitwise.
#include <gtest/gtest.h>

#if MESHTRAIN_CUDA

#include <vector>

#include "kernels/cuda_test_util.h"
#include "kernels/kernels.h"
#include "kernels/test_util.h"

namespace mt::kernels {
namespace {

using test::bitwise_equal;
using test::Gpu;
using test::OnGpu;
using test::randn;

constexpr double kF32 = 1e-5;

TEST(CudaLlamaKernels, RmsNormMatchesCpuAndIsDeterministic) {
  MT_REQUIRE_GPU();
  struct S {
    int64_t n, c;
  };
  for (const S s : {S{7, 24}, S{13, 768}, S{5, 1000}, S{1001, 7}, S{3, 4099}}) {
    const int64_t nc = s.n * s.c;
    const auto x = randn(nc, 30, 2.0f), w = randn(s.c, 31), dy = randn(nc, 33);
    const auto dx0 = randn(nc, 34), dw0 = randn(s.c, 35);
    std::vector<float> y(nc), rstd(s.n), dx = dx0, dw = dw0;
    rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), s.n, s.c, 1e-5f);
    rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), s.n, s.c);
    OnGpu g;
    Gpu<float> gx(x), gw(w), gdy(dy);
    auto gy = Gpu<float>::poisoned(nc), gr = Gpu<float>::poisoned(s.n);
    rmsnorm_forward(gy.get(), gr.get(), gx.get(), gw.get(), s.n, s.c, 1e-5f);
    MT_EXPECT_REL(gy.host(), y, kF32, "rmsnorm y");
    MT_EXPECT_REL(gr.host(), rstd, kF32, "rmsnorm rstd");
    std::vector<float> first[2];
    for (int run = 0; run < 2; ++run) {
      Gpu<float> gdx(dx0), gdw(dw0);
      rmsnorm_backward(gdx.get(), gdw.get(), gdy.get(), gx.get(), gw.get(), gr.get(), s.n, s.c);
      const auto hdx = gdx.host(), hdw = gdw.host();
      MT_EXPECT_REL(hdx, dx, kF32, "rmsnorm dx (accumulated)");
      MT_EXPECT_REL(hdw, dw, kF32, "rmsnorm dw (accumulated)");
      if (run == 0) {
        first[0] = hdx;
        first[1] = hdw;
      } else {
        EXPECT_TRUE(bitwise_equal(hdx, first[0]) && bitwise_equal(hdw, first[1]))
            << "rmsnorm backward is not deterministic";
      }
    }
  }
}

TEST(CudaLlamaKernels, RopeMatchesCpu) {
  MT_REQUIRE_GPU();
  const int64_t B = 2, T = 37, heads = 6, kvh = 2, hd = 64, half = hd / 2;
  const int64_t stride = (heads + 2 * kvh) * hd, n = B * T * stride;
  const auto x0 = randn(n, 40), cs = randn(T * half, 41), sn = randn(T * half, 42);
  for (bool backward : {false, true}) {
    auto fn = backward ? rope_backward : rope_forward;
    std::vector<float> want = x0;
    fn(want.data(), B, T, stride, 0, heads, hd, cs.data(), sn.data());
    fn(want.data(), B, T, stride, heads * hd, kvh, hd, cs.data(), sn.data());
    OnGpu g;
    Gpu<float> gx(x0), gc(cs), gs(sn);
    fn(gx.get(), B, T, stride, 0, heads, hd, gc.get(), gs.get());
    fn(gx.get(), B, T, stride, heads * hd, kvh, hd, gc.get(), gs.get());
    MT_EXPECT_REL(gx.host(), want, kF32, backward ? "rope_backward" : "rope_forward");
  }
}

TEST(CudaLlamaKernels, SwigluMatchesCpu) {
  MT_REQUIRE_GPU();
  for (auto [n, f] : {std::pair<int64_t, int64_t>{3, 300}, {1, 1}, {64, 2048}}) {
    const auto h = randn(n * 2 * f, 50, 3.0f), dy = randn(n * f, 51);
    std::vector<float> y(n * f), dh(n * 2 * f);
    swiglu_forward(y.data(), h.data(), n, f);
    swiglu_backward(dh.data(), h.data(), dy.data(), n, f);
    OnGpu g;
    Gpu<float> gh(h), gdy(dy);
    auto gy = Gpu<float>::poisoned(n * f), gdh = Gpu<float>::poisoned(n * 2 * f);
    swiglu_forward(gy.get(), gh.get(), n, f);
    swiglu_backward(gdh.get(), gh.get(), gdy.get(), n, f);
    MT_EXPECT_REL(gy.host(), y, kF32, "swiglu y");
    MT_EXPECT_REL(gdh.host(), dh, kF32, "swiglu dh");
  }
}

TEST(CudaLlamaKernels, KvHeadsAreBitwiseTheCpus) {
  MT_REQUIRE_GPU();
  struct S {
    int64_t n, heads, kv, hd;
  };
  for (const S s : {S{7, 6, 2, 5}, S{33, 32, 8, 64}, S{3, 4, 1, 8}, S{2, 3, 3, 4}}) {
    const int64_t C = s.heads * s.hd, W = C + 2 * s.kv * s.hd;
    const auto qkv = randn(s.n * W, 60), dfull = randn(s.n * 3 * C, 61);
    std::vector<float> full(s.n * 3 * C), dqkv(s.n * W);
    expand_kv_heads(full.data(), qkv.data(), s.n, s.heads, s.kv, s.hd);
    reduce_kv_heads(dqkv.data(), dfull.data(), s.n, s.heads, s.kv, s.hd);
    OnGpu g;
    Gpu<float> gq(qkv), gdf(dfull);
    auto gfull = Gpu<float>::poisoned(s.n * 3 * C), gdq = Gpu<float>::poisoned(s.n * W);
    expand_kv_heads(gfull.get(), gq.get(), s.n, s.heads, s.kv, s.hd);
    reduce_kv_heads(gdq.get(), gdf.get(), s.n, s.heads, s.kv, s.hd);
    EXPECT_TRUE(bitwise_equal(gfull.host(), full)) << "expand_kv_heads heads " << s.heads;
    EXPECT_TRUE(bitwise_equal(gdq.host(), dqkv)) << "reduce_kv_heads heads " << s.heads;
  }
}

}  // namespace
}  // namespace mt::kernels

#else  // a build without CUDA

TEST(CudaLlamaKernels, Skipped) {
  GTEST_SKIP() << "built without CUDA: the CUDA kernels are not compiled";
}

#endif

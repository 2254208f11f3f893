// The CUDA kernels of the Llama-family parts (kernels/cuda/llama_kernels.cuh: RMSNorm,
// rotary embeddings, SwiGLU, the grouped-query kv-head expansion and its transpose) and the
// embedding without a position table, run on the CPU under the host emulation of
// kernels/cuda_emu/cuda_emu.h, through the launches llama.cu makes, against the CPU kernels
// (the oracle). Like cuda_emulated_test (read its top): every output element must be written
// (outputs start as NaN) and nothing outside (guard zones); what the emulator does not model
// (the GPU's expf bits, FMA contraction) is left to cuda_kernels_test on a GPU.
//
// Tolerances (relative norm, cuda_emulated_test's): 1e-5 for f32 kernels whose additions run
// in another order or whose exp is glibc's expf against the CPU's fast_exp (RMSNorm's row
// sums in a block tree, SwiGLU's sigmoid); 1e-6 where only FMA contraction can differ (the
// rotation: two products and a sum per element). The copies and the kv-head sums, added in
// the CPU's order, are bitwise.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda_test_util.h"
#include "kernels/kernels.h"
#include "kernels/test_util.h"

// The emulator first: it defines the CUDA names the kernels' headers use.
#include "kernels/cuda_emu/cuda_emu.h"
// (A block of its own, so that sorting the includes keeps this order.)
#include "kernels/cuda/embedding_kernels.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/llama_kernels.cuh"
#include "kernels/cuda/reduce_kernels.cuh"
#include "kernels/cuda_emu/emu_test_util.h"

namespace mt::kernels {
namespace {

namespace cu = cuda;
namespace cd = cuda::detail;
namespace emu = cuda_emu;
using emu_test::blocks;
using emu_test::count_nan;
using emu_test::Guarded;
using emu_test::kBlock;
using emu_test::run;
using test::bitwise_equal;
using test::randn;

constexpr double kF32 = 1e-5;
constexpr double kRotation = 1e-6;

// llama.cu's rmsnorm_forward and rmsnorm_backward (dx accumulated; dw by partials over
// column_chunks, added to what dw held).
void check_rmsnorm(int64_t n, int64_t c, uint32_t seed) {
  const std::string what = "rmsnorm n=" + std::to_string(n) + " c=" + std::to_string(c);
  SCOPED_TRACE(what);
  const float eps = 1e-5f;
  const auto x = randn(n * c, seed, 2.0f), w = randn(c, seed + 1), dy = randn(n * c, seed + 2);
  const auto dx0 = randn(n * c, seed + 3), dw0 = randn(c, seed + 4);
  std::vector<float> y(n * c), rstd(n), dx = dx0, dw = dw0;
  rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), n, c, eps);
  rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), n, c);

  Guarded<> gy(n * c), grstd(n);
  run(cu::rmsnorm_forward_kernel<float>, blocks(n), gy.get(), grstd.get(), x.data(), w.data(), c,
      eps);
  Guarded<uint16_t> gyb(n * c);  // the bf16 overload's instantiation
  Guarded<> grstd_b(n);
  run(cu::rmsnorm_forward_kernel<uint16_t>, blocks(n), gyb.get(), grstd_b.get(), x.data(), w.data(),
      c, eps);
  emu_test::expect_rounded(gyb.values(), gy.values(), what + " y in bf16");
  auto gdx = Guarded<>::from(dx0), gdw = Guarded<>::from(dw0);
  run(cu::rmsnorm_backward_dx_kernel, blocks(n), gdx.get(), dy.data(), x.data(), w.data(),
      grstd.get(), c);
  const cd::ColumnChunks p = cd::column_chunks(n, c);
  Guarded<> pw(p.chunks * c);
  run(cu::rmsnorm_backward_partials_kernel,
      emu::Dim3{static_cast<unsigned>((c + kBlock - 1) / kBlock), static_cast<unsigned>(p.chunks),
                1},
      pw.get(), dy.data(), x.data(), grstd.get(), n, c, p.rows_per_chunk);
  run(cd::add_partials_kernel, blocks(cd::grid_for(c)), gdw.get(), pw.get(), p.chunks, c);
  EXPECT_EQ(count_nan(gy.values()), 0);
  MT_EXPECT_REL(gy.values(), y, kF32, what + " y");
  MT_EXPECT_REL(grstd.values(), rstd, kF32, what + " rstd");
  MT_EXPECT_REL(gdx.values(), dx, kF32, what + " dx (accumulated)");
  MT_EXPECT_REL(gdw.values(), dw, kF32, what + " dw (accumulated)");
}

TEST(CudaLlamaEmulated, RmsNormMatchesCpu) {
  check_rmsnorm(5, 300, 200);  // c above the block, not a multiple of it or of 4
  check_rmsnorm(3, 37, 210);
  check_rmsnorm(2, 1, 220);    // one column
  check_rmsnorm(601, 3, 230);  // more rows than column_chunks' chunks: several rows per chunk
}

// llama.cu's rope_forward / rope_backward on the q and the k columns of a fused qkv row, as
// Block::rotate_qkv calls them; the v columns must stay untouched.
TEST(CudaLlamaEmulated, RopeMatchesCpuAndLeavesTheValuesAlone) {
  const int64_t B = 2, T = 5, heads = 3, kvh = 1, hd = 8, half = hd / 2;
  const int64_t stride = (heads + 2 * kvh) * hd, n = B * T * stride;
  const auto x0 = randn(n, 300), cs = randn(T * half, 301), sn = randn(T * half, 302);
  for (bool backward : {false, true}) {
    SCOPED_TRACE(backward ? "rope_backward" : "rope_forward");
    std::vector<float> want = x0;
    auto cpu = backward ? rope_backward : rope_forward;
    cpu(want.data(), B, T, stride, 0, heads, hd, cs.data(), sn.data());
    cpu(want.data(), B, T, stride, heads * hd, kvh, hd, cs.data(), sn.data());
    auto got = Guarded<>::from(x0);
    const float sign = backward ? -1.0f : 1.0f;
    for (auto [col0, h] : {std::pair<int64_t, int64_t>{0, heads}, {heads * hd, kvh}}) {
      const int64_t total = B * T * h * half;
      run(cu::rope_kernel, blocks(cd::grid_for(total)), got.get(), T, stride, col0, h, hd,
          cs.data(), sn.data(), sign, total);
    }
    const auto g = got.values();
    MT_EXPECT_REL(g, want, kRotation, "rotated rows");
    for (int64_t r = 0; r < B * T; ++r)
      for (int64_t j = (heads + kvh) * hd; j < stride; ++j)
        ASSERT_EQ(g[r * stride + j], x0[r * stride + j]) << "v column " << j << " of row " << r;
  }
}

TEST(CudaLlamaEmulated, SwigluMatchesCpu) {
  for (auto [n, f] : {std::pair<int64_t, int64_t>{3, 300}, {1, 1}, {4, 37}}) {
    const std::string what = "swiglu n=" + std::to_string(n) + " f=" + std::to_string(f);
    const auto h = randn(n * 2 * f, 400, 3.0f), dy = randn(n * f, 401);
    std::vector<float> y(n * f), dh(n * 2 * f);
    swiglu_forward(y.data(), h.data(), n, f);
    swiglu_backward(dh.data(), h.data(), dy.data(), n, f);
    Guarded<> gy(n * f), gdh(n * 2 * f);
    run(cu::swiglu_forward_kernel<float>, blocks(cd::grid_for(n * f)), gy.get(), h.data(), f,
        n * f);
    Guarded<uint16_t> gyb(n * f);
    run(cu::swiglu_forward_kernel<uint16_t>, blocks(cd::grid_for(n * f)), gyb.get(), h.data(), f,
        n * f);
    emu_test::expect_rounded(gyb.values(), gy.values(), what + " y in bf16");
    run(cu::swiglu_backward_kernel, blocks(cd::grid_for(n * f)), gdh.get(), h.data(), dy.data(), f,
        n * f);
    MT_EXPECT_REL(gy.values(), y, kF32, what + " y");
    MT_EXPECT_REL(gdh.values(), dh, kF32, what + " dh (gate and up halves)");
  }
}

TEST(CudaLlamaEmulated, KvHeadsAreBitwiseTheCpus) {
  struct S {
    int64_t n, heads, kv, hd;
  };
  for (const S s : {S{7, 6, 2, 5}, S{3, 4, 1, 8}, S{2, 3, 3, 4}}) {
    const std::string what = "heads " + std::to_string(s.heads) + " kv " + std::to_string(s.kv);
    const int64_t C = s.heads * s.hd, W = C + 2 * s.kv * s.hd;
    const auto qkv = randn(s.n * W, 500), dfull = randn(s.n * 3 * C, 501);
    std::vector<float> full(s.n * 3 * C), dqkv(s.n * W);
    expand_kv_heads(full.data(), qkv.data(), s.n, s.heads, s.kv, s.hd);
    reduce_kv_heads(dqkv.data(), dfull.data(), s.n, s.heads, s.kv, s.hd);
    Guarded<> gfull(s.n * 3 * C), gdqkv(s.n * W);
    run(cu::expand_kv_heads_kernel, blocks(cd::grid_for(s.n * 3 * C)), gfull.get(), qkv.data(),
        s.heads, s.kv, s.hd, s.n * 3 * C);
    run(cu::reduce_kv_heads_kernel, blocks(cd::grid_for(s.n * W)), gdqkv.get(), dfull.data(),
        s.heads, s.kv, s.hd, s.n * W);
    EXPECT_TRUE(bitwise_equal(gfull.values(), full)) << what << ": expand_kv_heads";
    EXPECT_TRUE(bitwise_equal(gdqkv.values(), dqkv)) << what << ": reduce_kv_heads";
  }
}

// A rotary model has no position table: embedding.cu passes wpe = nullptr, and the row is the
// token's, bit for bit (the CPU copies it; adding 0 would turn -0 into +0).
TEST(CudaLlamaEmulated, EmbeddingWithoutPositionsIsTheTokenRow) {
  const int64_t B = 2, T = 3, C = 300, V = 11;
  auto wte = randn(V * C, 600);
  wte[5] = -0.0f;
  const std::vector<int32_t> tokens = {0, 4, 10, 0, 7, 3};
  std::vector<float> y(B * T * C);
  embedding_forward(y.data(), tokens.data(), wte.data(), nullptr, B, T, C);
  Guarded<> gy(B * T * C);
  run(cu::embedding_forward_kernel, blocks(cd::grid_for(B * T * C)), gy.get(), tokens.data(),
      wte.data(), static_cast<const float*>(nullptr), T, C, B * T * C);
  EXPECT_TRUE(bitwise_equal(gy.values(), y));
}

}  // namespace
}  // namespace mt::kernels

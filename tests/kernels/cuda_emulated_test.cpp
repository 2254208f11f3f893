// The custom CUDA kernels other than the fused attention (flash_emulated_test), their real
// source (kernels/cuda/*_kernels.cuh and device_util.cuh), run on the CPU under the host
// emulation of kernels/cuda_emu/cuda_emu.h, through the launches their .cu files make (the
// same kernels, block size kThreads and grids: launch.h's grid_for and column_chunks, the
// kernels' headers' constants), against the CPU kernels, the oracle. It needs neither nvcc nor
// a GPU, so every build runs it (CI included). Host code that the .cu files run between the
// kernels is done here by the CPU: the GEMMs of the plain attention (cuBLASLt there; the CPU's
// gemm_batched here, with the same arguments), the CUB radix sort of the embedding backward
// (std::stable_sort of the same (key, position) pairs here), the AdamW bias corrections.
//
// It checks each kernel's indexing, masks, grid-stride and block-stride loops, block
// reductions (the static __shared__ arrays and their barriers; under TSan any race), and that
// every output element is written (outputs start as NaN) and nothing outside (guard zones).
// It cannot check what the emulator does not model (cuda_emu.h: the GPU's expf/logf bits,
// FMA contraction, timing, the host runtime) nor cuBLASLt and CUB: cuda_kernels_test does,
// on a GPU.
//
// Tolerances: cuda_kernels_test's for the same kernel (relative norm ||emulated - cpu|| /
// ||cpu||, or bitwise where it demands bitwise), for the same reasons: f32 kernels 1e-5 (the
// order of additions, glibc's expf against the CPU kernels' fast_exp), chains 3e-5, kernels
// that add in the CPU's order 1e-6, bf16-rounded outputs 1e-2, double sums 1e-12.
//
// Shapes hit the edges: rows and columns not multiples of the block (256) or of 4, C above
// the block, T not a multiple of anything, one-element rows, repeated token ids, targets
// outside the slice, AdamW segments of odd lengths and empty ones. Kept small: a block is
// 256 fibers, and every __syncthreads switches through all of them (more under TSan).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/cuda_test_util.h"
#include "kernels/kernels.h"
#include "kernels/mixed.h"
#include "kernels/test_util.h"
#include "kernels/vocab_parallel.h"

// The emulator first: it defines the CUDA names the kernels' headers use.
#include "kernels/cuda_emu/cuda_emu.h"
// (A block of its own, so that sorting the includes keeps this order.)
#include "kernels/cuda/adamw_kernels.cuh"
#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/cross_entropy_kernels.cuh"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/elementwise_kernels.cuh"
#include "kernels/cuda/embedding_kernels.cuh"
#include "kernels/cuda/gelu_kernels.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/layernorm_kernels.cuh"
#include "kernels/cuda/mixed_kernels.cuh"
#include "kernels/cuda/reduce_kernels.cuh"
#include "kernels/cuda/vocab_parallel_kernels.cuh"
#include "kernels/cuda_emu/emu_test_util.h"

namespace mt::kernels {
namespace {

namespace cu = cuda;
namespace cd = cuda::detail;
namespace emu = cuda_emu;
using test::bitwise_equal;
using test::randn;
using test::random_tokens;

// cuda_kernels_test's tolerances (see the top).
constexpr double kF32 = 1e-5;
constexpr double kF32Chain = 3e-5;
constexpr double kBf16Out = 1e-2;
constexpr double kOrdered = 1e-6;

using emu_test::blocks;
using emu_test::count_nan;
using emu_test::Guarded;
using emu_test::kBlock;
using emu_test::run;

// ---- attention: the causal softmax kernels between the CPU's GEMMs ---------------------------

struct AttnShape {
  int64_t B, T, C, NH;
};

// attention.cu's forward and backward with the GEMMs on the CPU (the same gemm_batched
// arguments as the cuBLASLt calls there) and the softmax kernels emulated. The upper triangle
// of the GEMMs' T x T results is poisoned before each kernel: the kernels must write exact
// zeros there without reading it.
void check_attention(const AttnShape& s, uint32_t seed) {
  const std::string what = "attention B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) +
                           " C=" + std::to_string(s.C) + " NH=" + std::to_string(s.NH);
  SCOPED_TRACE(what);
  const int64_t B = s.B, T = s.T, C = s.C, NH = s.NH, hd = C / NH, C3 = 3 * C, TT = T * T;
  const int64_t n_qkv = B * T * C3, n_out = B * T * C, n_att = B * NH * TT;
  const auto qkv = randn(n_qkv, seed), dout = randn(n_out, seed + 1);
  std::vector<float> out(n_out), att(n_att), dqkv(n_qkv), scratch(n_att);
  ASSERT_EQ(attention_stash_elems(B, NH, T), n_att);
  attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);

  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto poison_upper = [&](float* m) {
    for (int64_t r = 0; r < B * NH * T; ++r)
      for (int64_t j = r % T + 1; j < T; ++j) m[r * T + j] = nan;
  };
  Guarded<> gatt(n_att), gscr(n_att), gout(n_out), gdqkv(n_qkv);
  for (int64_t b = 0; b < B; ++b) {
    const float* q = qkv.data() + b * T * C3;
    gemm_batched(false, true, T, T, hd, scale, q, C3, hd, q + C, C3, hd, 0.0f,
                 gatt.get() + b * NH * TT, T, TT, NH);
  }
  poison_upper(gatt.get());
  run(cu::causal_softmax_kernel, blocks(B * NH * T), gatt.get(), T);
  for (int64_t b = 0; b < B; ++b)
    gemm_batched(false, false, T, hd, T, 1.0f, gatt.get() + b * NH * TT, T, TT,
                 qkv.data() + b * T * C3 + 2 * C, C3, hd, 0.0f, gout.get() + b * T * C, C, hd, NH);
  // backward
  for (int64_t b = 0; b < B; ++b)
    gemm_batched(false, true, T, T, hd, 1.0f, dout.data() + b * T * C, C, hd,
                 qkv.data() + b * T * C3 + 2 * C, C3, hd, 0.0f, gscr.get() + b * NH * TT, T, TT,
                 NH);
  poison_upper(gscr.get());
  run(cu::causal_softmax_backward_kernel, blocks(B * NH * T), gscr.get(), gatt.get(), T, scale);
  for (int64_t b = 0; b < B; ++b) {
    const float* q = qkv.data() + b * T * C3;
    const float* ds = gscr.get() + b * NH * TT;
    const float* p = gatt.get() + b * NH * TT;
    float* dq = gdqkv.get() + b * T * C3;
    gemm_batched(false, false, T, hd, T, 1.0f, ds, T, TT, q + C, C3, hd, 0.0f, dq, C3, hd, NH);
    gemm_batched(true, false, T, hd, T, 1.0f, ds, T, TT, q, C3, hd, 0.0f, dq + C, C3, hd, NH);
    gemm_batched(true, false, T, hd, T, 1.0f, p, T, TT, dout.data() + b * T * C, C, hd, 0.0f,
                 dq + 2 * C, C3, hd, NH);
  }

  const auto ga = gatt.values(), gs = gscr.values();
  EXPECT_EQ(count_nan(ga), 0) << "att";
  EXPECT_EQ(count_nan(gs), 0) << "dS";
  MT_EXPECT_REL(ga, att, kF32, what + " att");
  for (int64_t r = 0; r < B * NH * T; ++r)
    for (int64_t j = r % T + 1; j < T; ++j) {
      ASSERT_EQ(ga[r * T + j], 0.0f) << "att row " << r << " col " << j;
      ASSERT_EQ(gs[r * T + j], 0.0f) << "dS row " << r << " col " << j;
    }
  MT_EXPECT_REL(gout.values(), out, kF32, what + " out");
  MT_EXPECT_REL(gdqkv.values(), dqkv, kF32Chain, what + " dqkv");
}

TEST(CudaEmulated, AttentionSoftmaxMatchesCpu) {
  check_attention({1, 13, 16, 2}, 10);  // T odd, hd 8, NH above 1
  check_attention({2, 5, 8, 1}, 20);    // B above 1
  check_attention({1, 1, 8, 1}, 30);    // one key
  // Not here: rows longer than the block (T > 256, a second stride of the loops): T blocks of
  // 30 barriers each cost seconds; layer norm and cross-entropy cover that loop shape.
}

// ---- layer norm ---------------------------------------------------------------------------

void check_layernorm(int64_t n, int64_t c, bool bias, uint32_t seed) {
  const std::string what =
      "layernorm n=" + std::to_string(n) + " c=" + std::to_string(c) + (bias ? "" : " (no bias)");
  SCOPED_TRACE(what);
  const auto x = randn(n * c, seed, 2.0f), w = randn(c, seed + 1), b = randn(c, seed + 2);
  const auto dy = randn(n * c, seed + 3), dx0 = randn(n * c, seed + 4);
  const auto dw0 = randn(c, seed + 5), db0 = randn(c, seed + 6);
  const float* bp = bias ? b.data() : nullptr;
  std::vector<float> y(n * c), mean(n), rstd(n), dx = dx0, dw = dw0, db = db0;
  layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), bp, n, c);
  layernorm_backward(dx.data(), dw.data(), bias ? db.data() : nullptr, dy.data(), x.data(),
                     w.data(), mean.data(), rstd.data(), n, c);

  // layernorm.cu's launches.
  Guarded<> gy(n * c), gmean(n), grstd(n);
  run(cu::layernorm_forward_kernel<float>, blocks(n), gy.get(), gmean.get(), grstd.get(), x.data(),
      w.data(), bp, c);
  Guarded<uint16_t> gyb(n * c);  // the bf16 overload's instantiation
  Guarded<> gmean_b(n), grstd_b(n);
  run(cu::layernorm_forward_kernel<uint16_t>, blocks(n), gyb.get(), gmean_b.get(), grstd_b.get(),
      x.data(), w.data(), bp, c);
  auto gdx = Guarded<>::from(dx0), gdw = Guarded<>::from(dw0), gdb = Guarded<>::from(db0);
  run(cu::layernorm_backward_dx_kernel, blocks(n), gdx.get(), dy.data(), x.data(), w.data(),
      mean.data(), rstd.data(), c);
  const cd::ColumnChunks p = cd::column_chunks(n, c);
  Guarded<> pw(p.chunks * c), pb(p.chunks * c);
  const emu::Dim3 grid{static_cast<unsigned>((c + kBlock - 1) / kBlock),
                       static_cast<unsigned>(p.chunks), 1};
  run(cu::layernorm_backward_partials_kernel, grid, pw.get(), bias ? pb.get() : nullptr, dy.data(),
      x.data(), mean.data(), rstd.data(), n, c, p.rows_per_chunk);
  // detail::add_partials
  run(cd::add_partials_kernel, blocks(cd::grid_for(c)), gdw.get(), pw.get(), p.chunks, c);
  if (bias) run(cd::add_partials_kernel, blocks(cd::grid_for(c)), gdb.get(), pb.get(), p.chunks, c);

  MT_EXPECT_REL(gy.values(), y, kF32, what + " y");
  emu_test::expect_rounded(gyb.values(), gy.values(), what + " y in bf16");
  EXPECT_TRUE(bitwise_equal(grstd_b.values(), grstd.values())) << "rstd beside the bf16 y";
  MT_EXPECT_REL(gmean.values(), mean, kF32, what + " mean");
  MT_EXPECT_REL(grstd.values(), rstd, kF32, what + " rstd");
  MT_EXPECT_REL(gdx.values(), dx, kF32Chain, what + " dx (accumulated)");
  EXPECT_EQ(count_nan(pw.values()), 0) << "dw partials";
  MT_EXPECT_REL(gdw.values(), dw, kF32, what + " dw (accumulated)");
  if (bias) {
    EXPECT_EQ(count_nan(pb.values()), 0) << "db partials";
    MT_EXPECT_REL(gdb.values(), db, kF32, what + " db (accumulated)");
  } else {
    EXPECT_TRUE(bitwise_equal(gdb.values(), db0)) << "db written without a bias";
  }
}

TEST(CudaEmulated, LayerNormMatchesCpu) {
  check_layernorm(5, 300, true, 100);  // c above the block, not a multiple of it or of 4
  check_layernorm(3, 37, false, 110);  // no bias
  check_layernorm(2, 1, true, 120);    // one column: var 0
}

// More rows than column_chunks' 256 chunks (3 rows per chunk, the last chunk short): the dw/db
// partials and their sum only, from the CPU's mean and rstd (a forward of 601 rows would be
// 601 blocks of 20 barriers).
TEST(CudaEmulated, LayerNormDwDbOverManyRowsPerChunk) {
  const int64_t n = 601, c = 3;
  const auto x = randn(n * c, 130, 2.0f), w = randn(c, 131), b = randn(c, 132);
  const auto dy = randn(n * c, 133), dw0 = randn(c, 134), db0 = randn(c, 135);
  std::vector<float> y(n * c), mean(n), rstd(n), dx(n * c), dw = dw0, db = db0;
  layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), n, c);
  layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(),
                     rstd.data(), n, c);
  const cd::ColumnChunks p = cd::column_chunks(n, c);
  ASSERT_GT(p.rows_per_chunk, 1);
  Guarded<> pw(p.chunks * c), pb(p.chunks * c);
  auto gdw = Guarded<>::from(dw0), gdb = Guarded<>::from(db0);
  run(cu::layernorm_backward_partials_kernel,
      emu::Dim3{static_cast<unsigned>((c + kBlock - 1) / kBlock), static_cast<unsigned>(p.chunks),
                1},
      pw.get(), pb.get(), dy.data(), x.data(), mean.data(), rstd.data(), n, c, p.rows_per_chunk);
  run(cd::add_partials_kernel, blocks(cd::grid_for(c)), gdw.get(), pw.get(), p.chunks, c);
  run(cd::add_partials_kernel, blocks(cd::grid_for(c)), gdb.get(), pb.get(), p.chunks, c);
  MT_EXPECT_REL(gdw.values(), dw, kF32, "layernorm dw, 601 rows (accumulated)");
  MT_EXPECT_REL(gdb.values(), db, kF32, "layernorm db, 601 rows (accumulated)");
}

// ---- cross entropy ------------------------------------------------------------------------

TEST(CudaEmulated, CrossEntropyMatchesCpuWithPaddedVocab) {
  struct S {
    int64_t n, V, Vp;
  };
  for (const S s : {S{4, 5, 5}, S{3, 300, 301}, S{5, 37, 48}}) {
    const std::string what = "cross_entropy n=" + std::to_string(s.n) +
                             " V=" + std::to_string(s.V) + " Vp=" + std::to_string(s.Vp);
    SCOPED_TRACE(what);
    auto logits = randn(s.n * s.Vp, 60, 3.0f);
    // Padding columns hold NaN: neither side may read them.
    for (int64_t i = 0; i < s.n; ++i)
      for (int64_t j = s.V; j < s.Vp; ++j)
        logits[i * s.Vp + j] = std::numeric_limits<float>::quiet_NaN();
    const auto targets = random_tokens(s.n, 0, static_cast<int32_t>(s.V), 61);
    std::vector<float> losses(s.n), lse(s.n), dl(s.n * s.Vp);
    cross_entropy_forward(losses.data(), lse.data(), logits.data(), targets.data(), s.n, s.V, s.Vp);
    cross_entropy_backward(dl.data(), logits.data(), lse.data(), targets.data(), 0.37f, s.n, s.V,
                           s.Vp);
    Guarded<> gl(s.n), glse(s.n), gdl(s.n * s.Vp);
    run(cu::cross_entropy_forward_kernel, blocks(s.n), gl.get(), glse.get(), logits.data(),
        targets.data(), s.V, s.Vp);
    const auto glse_v = glse.values();
    run(cu::cross_entropy_backward_kernel, blocks(cd::grid_for(s.n * s.Vp)), gdl.get(),
        logits.data(), glse_v.data(), targets.data(), 0.37f, s.n, s.V, s.Vp);
    MT_EXPECT_REL(gl.values(), losses, kF32, what + " losses");
    MT_EXPECT_REL(glse_v, lse, kF32, what + " lse");
    MT_EXPECT_REL(gdl.values(), dl, kF32, what + " dlogits");
    // In place (dlogits aliases logits).
    auto inplace = Guarded<>::from(logits);
    run(cu::cross_entropy_backward_kernel, blocks(cd::grid_for(s.n * s.Vp)), inplace.get(),
        inplace.get(), glse_v.data(), targets.data(), 0.37f, s.n, s.V, s.Vp);
    MT_EXPECT_REL(inplace.values(), dl, kF32, what + " dlogits in place");
  }
}

// A target outside [0, V): that row's loss, lse and gradients are NaN (the .cu's contract;
// the CPU kernel throws instead), the other rows are unaffected.
TEST(CudaEmulated, CrossEntropyBadTargetGivesNanRow) {
  const int64_t n = 3, V = 10, Vp = 12;
  const auto logits = randn(n * Vp, 62);
  const std::vector<int32_t> targets = {2, static_cast<int32_t>(V), -1};
  Guarded<> gl(n), glse(n), gdl(n * Vp);
  run(cu::cross_entropy_forward_kernel, blocks(n), gl.get(), glse.get(), logits.data(),
      targets.data(), V, Vp);
  const auto l = gl.values(), s = glse.values();
  run(cu::cross_entropy_backward_kernel, blocks(cd::grid_for(n * Vp)), gdl.get(), logits.data(),
      s.data(), targets.data(), 1.0f, n, V, Vp);
  const auto d = gdl.values();
  EXPECT_FALSE(std::isnan(l[0]) || std::isnan(s[0]));
  for (int64_t i = 1; i < n; ++i) EXPECT_TRUE(std::isnan(l[i]) && std::isnan(s[i])) << i;
  for (int64_t j = 0; j < Vp; ++j) {
    EXPECT_FALSE(std::isnan(d[j])) << j;
    EXPECT_TRUE(std::isnan(d[Vp + j]) && std::isnan(d[2 * Vp + j])) << j;
  }
}

// ---- AdamW --------------------------------------------------------------------------------

struct Corr {
  float c1, c2;
};
// adamw.cu's corrections (computed on the host there too, as the CPU does).
Corr corrections(float beta1, float beta2, int64_t t) {
  return {1.0f / static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), t)),
          1.0f / static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), t))};
}

TEST(CudaEmulated, AdamwMatchesCpu) {
  const int64_t n = 1037;  // 5 blocks, the last partly empty
  const auto p0 = randn(n, 90), g0 = randn(n, 91, 0.1f), m0 = randn(n, 92, 0.01f);
  auto v0 = randn(n, 93, 0.001f);
  for (auto& x : v0) x = std::fabs(x);
  for (int64_t t : {1, 7}) {
    auto p = p0, m = m0, v = v0;
    adamw_update(p.data(), g0.data(), m.data(), v.data(), n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
    const Corr c = corrections(0.9f, 0.95f, t);
    for (bool mixed : {false, true}) {
      const std::string what =
          std::string(mixed ? "adamw_update_mixed" : "adamw_update") + " t=" + std::to_string(t);
      auto gp = Guarded<>::from(p0), gm = Guarded<>::from(m0), gv = Guarded<>::from(v0);
      Guarded<uint16_t> gb(n, 0xffff);  // a bf16 NaN
      run(cu::adamw_kernel, blocks(cd::grid_for(n)), gp.get(), mixed ? gb.get() : nullptr,
          g0.data(), gm.get(), gv.get(), n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, c.c1, c.c2);
      const auto hp = gp.values();
      MT_EXPECT_REL(hp, p, kOrdered, what + " param");
      MT_EXPECT_REL(gm.values(), m, kOrdered, what + " m");
      MT_EXPECT_REL(gv.values(), v, kOrdered, what + " v");
      if (mixed) {
        const auto b = gb.values();
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(b[i], f32_to_bf16(hp[i]).bits) << what << ": bf16 copy of element " << i;
      }
    }
  }
}

TEST(CudaEmulated, AdamwMultiMatchesCpuAndLeavesGapsAlone) {
  const int64_t n = 5000;
  // cuda_kernels_test's tables: gaps, empty segments (leading, inner, trailing), one element,
  // one element short of, exactly and one past a block's kElemsPerBlock, odd lengths.
  static_assert(cu::kElemsPerBlock == 1024, "the tables below are about blocks of 1024");
  const auto tables = test::adamw_segment_tables();
  const auto p0 = randn(n, 94), g0 = randn(n, 95, 0.1f), m0 = randn(n, 96, 0.01f);
  auto v0 = randn(n, 97, 0.001f);
  for (auto& x : v0) x = std::fabs(x);
  const Corr c = corrections(0.9f, 0.999f, 3);
  for (size_t tab = 0; tab < tables.size(); ++tab) {
    const auto& segs = tables[tab];
    const std::string what = "adamw_update_multi table " + std::to_string(tab);
    std::vector<bool> covered(n, false);
    for (const auto& sg : segs)
      for (int64_t i = sg.offset; i < sg.offset + sg.n; ++i) covered[i] = true;
    auto p = p0, m = m0, v = v0;
    // With a clipping scale: the kernel multiplies each gradient as it reads it.
    adamw_update_multi(p.data(), g0.data(), m.data(), v.data(), segs.data(),
                       static_cast<int64_t>(segs.size()), 1e-3f, 0.9f, 0.999f, 1e-8f, 3, 0.625f);
    // adamw.cu's table and grid.
    // Every other segment also writes its bf16 copy (the rest leave theirs alone).
    std::vector<uint16_t> copy(n, 0xFFFF);
    std::vector<cu::DeviceSegment> table;
    int64_t n_blocks = 0;
    for (size_t k = 0; k < segs.size(); ++k) {
      const auto& g = segs[k];
      table.push_back(cu::DeviceSegment{g.offset, g.n, n_blocks, g.weight_decay, 0.0f,
                                        k % 2 == 0 ? copy.data() + g.offset : nullptr});
      n_blocks += cu::segment_blocks(g.n);
    }
    auto gp = Guarded<>::from(p0), gm = Guarded<>::from(m0), gv = Guarded<>::from(v0);
    run(cu::adamw_multi_kernel, blocks(n_blocks), gp.get(), g0.data(), gm.get(), gv.get(),
        table.data(), static_cast<int64_t>(table.size()), 1e-3f, 0.9f, 0.999f, 1e-8f, c.c1, c.c2,
        0.625f);
    const auto hp = gp.values();
    MT_EXPECT_REL(hp, p, kOrdered, what + " param");
    MT_EXPECT_REL(gm.values(), m, kOrdered, what + " m");
    MT_EXPECT_REL(gv.values(), v, kOrdered, what + " v");
    for (int64_t i = 0; i < n; ++i)
      if (!covered[i]) {
        ASSERT_EQ(hp[i], p0[i]) << what << ": element " << i << " outside every segment changed";
      }
    std::vector<bool> copied(n, false);
    for (size_t k = 0; k < segs.size(); k += 2)
      for (int64_t i = segs[k].offset; i < segs[k].offset + segs[k].n; ++i) copied[i] = true;
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(copy[i], copied[i] ? f32_to_bf16(hp[i]).bits : uint16_t{0xFFFF})
          << what << ": bf16 copy of element " << i;
  }
}

// ---- reductions ---------------------------------------------------------------------------

// reduce.cu's sum_impl: kSumBlocks blocks, then one.
template <bool kSquares>
double emulated_sum(const std::vector<float>& x) {
  Guarded<double> partials(cd::kSumBlocks + 1);
  run(cd::sum_partials_kernel<kSquares>, blocks(cd::kSumBlocks), partials.get(), x.data(),
      static_cast<int64_t>(x.size()));
  run(cd::sum_finish_kernel, blocks(1), partials.get() + cd::kSumBlocks, partials.get());
  return partials.values()[cd::kSumBlocks];
}

TEST(CudaEmulated, SumsMatchCpu) {
  // The launch is kSumBlocks blocks of one block reduction each whatever n is, which makes
  // these the slowest launches here: one n per kind. sum_squares: 70001 elements, some
  // threads take a second stride; sum: 40000, the last blocks and threads see nothing.
  for (const bool squares : {true, false}) {
    const int64_t n = squares ? 70001 : 40000;
    const auto a = randn(n, 80);
    double abs_sum = 0;
    for (float v : a) abs_sum += std::fabs(v);
    // cuda_kernels_test: only the order of double additions differs.
    if (squares) {
      const double want = sum_squares(a.data(), n);
      EXPECT_NEAR(emulated_sum<true>(a), want, 1e-12 * std::fabs(want)) << "sum_squares";
    } else {
      EXPECT_NEAR(emulated_sum<false>(a), sum(a.data(), n), 1e-12 * abs_sum) << "sum";
    }
  }
}

// reduce.cu's add_column_sums: out[j] += sum_i x[i, j], against double sums (no CPU kernel
// has this entry point; the f32 partial sums make it kF32).
TEST(CudaEmulated, ColumnSumsMatchDouble) {
  struct S {
    int64_t n, c;
  };
  for (const S s : {S{5, 300}, S{601, 3}, S{1, 1}}) {
    const std::string what = "column sums n=" + std::to_string(s.n) + " c=" + std::to_string(s.c);
    const auto x = randn(s.n * s.c, 85), out0 = randn(s.c, 86);
    std::vector<float> want(s.c);
    for (int64_t j = 0; j < s.c; ++j) {
      double acc = out0[j];
      for (int64_t i = 0; i < s.n; ++i) acc += x[i * s.c + j];
      want[j] = static_cast<float>(acc);
    }
    const cd::ColumnChunks p = cd::column_chunks(s.n, s.c);
    Guarded<> partials(p.chunks * s.c);
    auto out = Guarded<>::from(out0);
    run(cd::column_partials_kernel,
        emu::Dim3{static_cast<unsigned>((s.c + kBlock - 1) / kBlock),
                  static_cast<unsigned>(p.chunks), 1},
        partials.get(), x.data(), s.n, s.c, p.rows_per_chunk);
    run(cd::add_partials_kernel, blocks(cd::grid_for(s.c)), out.get(), partials.get(), p.chunks,
        s.c);
    EXPECT_EQ(count_nan(partials.values()), 0) << what << " partials";
    MT_EXPECT_REL(out.values(), want, kF32, what);
  }
}

// ---- embeddings ---------------------------------------------------------------------------

// embedding.cu's accumulate_rows_by_token with the CUB radix sort done on the host: the keys
// kernel, a stable sort of the (key, position) pairs by key, the accumulation kernel.
void emulated_rows_by_token(float* dw, const float* dy, const std::vector<int32_t>& tokens,
                            int64_t C, int64_t v0, int64_t rows) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  Guarded<uint32_t> keys(n);
  Guarded<int32_t> vals(n);
  run(cd::token_keys_kernel, blocks(cd::grid_for(n)), keys.get(), vals.get(), tokens.data(), n, v0,
      rows);
  const std::vector<uint32_t> k = keys.values();
  const std::vector<int32_t> v = vals.values();
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return k[a] < k[b]; });
  std::vector<uint32_t> keys_out(n);
  std::vector<int32_t> vals_out(n);
  for (int64_t i = 0; i < n; ++i) keys_out[i] = k[order[i]], vals_out[i] = v[order[i]];
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(v[i], i) << "position " << i;
  run(cd::accumulate_sorted_kernel, blocks(n), dw, dy, keys_out.data(), vals_out.data(), n, C);
}

TEST(CudaEmulated, EmbeddingMatchesCpu) {
  struct S {
    int64_t B, T, C, V;
  };
  // cuda_kernels_test's small shapes: repeated tokens, C above the block, one token for all
  // positions (one run, also the last), T = 1.
  for (const S s : {S{2, 13, 24, 10}, S{1, 7, 300, 3}, S{2, 50, 40, 1}, S{5, 1, 7, 4}}) {
    const std::string what = "embedding B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) +
                             " C=" + std::to_string(s.C) + " V=" + std::to_string(s.V);
    SCOPED_TRACE(what);
    const int64_t n = s.B * s.T;
    const auto tokens = random_tokens(n, 0, static_cast<int32_t>(s.V), 70);
    const auto wte = randn(s.V * s.C, 71), wpe = randn(s.T * s.C, 72), dy = randn(n * s.C, 73);
    const auto dwte0 = randn(s.V * s.C, 74), dwpe0 = randn(s.T * s.C, 75);
    std::vector<float> y(n * s.C), dwte = dwte0, dwpe = dwpe0;
    embedding_forward(y.data(), tokens.data(), wte.data(), wpe.data(), s.B, s.T, s.C);
    embedding_backward(dwte.data(), dwpe.data(), dy.data(), tokens.data(), s.B, s.T, s.C);

    Guarded<> gy(n * s.C);
    run(cu::embedding_forward_kernel, blocks(cd::grid_for(n * s.C)), gy.get(), tokens.data(),
        wte.data(), wpe.data(), s.T, s.C, n * s.C);
    MT_EXPECT_REL(gy.values(), y, kF32, what + " y");
    auto gdwte = Guarded<>::from(dwte0), gdwpe = Guarded<>::from(dwpe0);
    // embedding.cu: every non-negative token is a row.
    emulated_rows_by_token(gdwte.get(), dy.data(), tokens, s.C, 0, int64_t{INT32_MAX} + 1);
    run(cu::position_backward_kernel, blocks(cd::grid_for(s.T * s.C)), gdwpe.get(), dy.data(), s.B,
        s.T, s.C);
    MT_EXPECT_REL(gdwte.values(), dwte, kOrdered, what + " dwte (accumulated)");
    MT_EXPECT_REL(gdwpe.values(), dwpe, kOrdered, what + " dwpe (accumulated)");
  }
}

// ---- vocabulary-parallel kernels ----------------------------------------------------------

TEST(CudaEmulated, VocabParallelMatchesCpu) {
  struct S {
    int64_t n, cols, real, v0, rows, C, T, first;
  };
  // cuda_kernels_test's shapes, the second with fewer rows: a slice wider than the block with
  // a real part that is not a multiple of it, C above the block, a first row past T.
  for (const S sh : {S{13, 40, 33, 50, 20, 24, 8, 5}, S{6, 600, 517, 1200, 517, 300, 5, 12}}) {
    const int64_t n = sh.n, cols = sh.cols, real = sh.real, v0 = sh.v0, C = sh.C, T = sh.T;
    const std::string what = "vocab_parallel n=" + std::to_string(n) +
                             " cols=" + std::to_string(cols) + " real=" + std::to_string(real);
    SCOPED_TRACE(what);
    const auto logits = randn(n * cols, 100, 3.0f);
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

    // vocab_parallel.cu's launches; each kernel from the CPU's inputs, checked on its own.
    Guarded<> gmx(n), gmx0(n), gse(n), gtl(n), glse(n), glosses(n), gdl(n * cols);
    run(cu::vp_max_kernel, blocks(n), gmx.get(), logits.data(), cols, real);
    run(cu::vp_max_kernel, blocks(n), gmx0.get(), logits.data(), cols, int64_t{0});
    run(cu::vp_sum_exp_kernel, blocks(n), gse.get(), gtl.get(), logits.data(), mx.data(),
        targets.data(), cols, real, v0);
    run(cu::vp_lse_kernel, blocks(cd::grid_for(n)), glse.get(), glosses.get(), mx.data(),
        sums.data(), n);
    run(cu::vp_ce_backward_kernel, blocks(cd::grid_for(n * cols)), gdl.get(), logits.data(),
        lse.data(), targets.data(), 0.5f, n, cols, real, v0);
    EXPECT_TRUE(bitwise_equal(gmx.values(), mx)) << "vocab_parallel_max";
    for (float x : gmx0.values()) EXPECT_EQ(x, -std::numeric_limits<float>::infinity());
    MT_EXPECT_REL(gse.values(), se, kF32, what + " sum_exp sums");
    EXPECT_TRUE(bitwise_equal(gtl.values(), tl)) << "vocab_parallel_sum_exp target logits";
    MT_EXPECT_REL(glse.values(), lse, kF32, what + " lse");
    MT_EXPECT_REL(glosses.values(), losses, kF32, what + " losses");
    MT_EXPECT_REL(gdl.values(), dl, kF32, what + " ce_backward");
    auto inplace = Guarded<>::from(logits);
    run(cu::vp_ce_backward_kernel, blocks(cd::grid_for(n * cols)), inplace.get(), inplace.get(),
        lse.data(), targets.data(), 0.5f, n, cols, real, v0);
    MT_EXPECT_REL(inplace.values(), dl, kF32, what + " ce_backward in place");

    // Embeddings of a slice of rows [v0, v0 + rows): tokens inside and outside, repeated.
    const int64_t rows = sh.rows;
    const auto wte = randn(rows * C, 102), dy = randn(n * C, 103), dwte0 = randn(rows * C, 104);
    const auto tok =
        random_tokens(n, static_cast<int32_t>(v0 - 10), static_cast<int32_t>(v0 + 10), 105);
    std::vector<float> ye(n * C), dwte = dwte0;
    vocab_parallel_embedding_forward(ye.data(), tok.data(), wte.data(), n, C, v0, rows);
    vocab_parallel_embedding_backward(dwte.data(), dy.data(), tok.data(), n, C, v0, rows);
    Guarded<> gye(n * C);
    run(cu::vp_embedding_forward_kernel, blocks(cd::grid_for(n * C)), gye.get(), tok.data(),
        wte.data(), n, C, v0, rows);
    EXPECT_TRUE(bitwise_equal(gye.values(), ye)) << "vocab_parallel_embedding_forward";
    auto gdwte = Guarded<>::from(dwte0);
    emulated_rows_by_token(gdwte.get(), dy.data(), tok, C, v0, rows);
    MT_EXPECT_REL(gdwte.values(), dwte, kOrdered, what + " embedding_backward");

    // Positions over rows [first, first + m) of a microbatch, wrapping around T; the bias add.
    const int64_t first = sh.first, m = 2 * T + 3;
    const auto wpe = randn(T * C, 106), yp0 = randn(m * C, 107), dyp = randn(m * C, 108),
               dwpe0 = randn(T * C, 109), bias = randn(C, 110);
    std::vector<float> yp = yp0, dwpe = dwpe0, yb = yp0;
    add_position_embedding(yp.data(), wpe.data(), first, m, T, C);
    position_embedding_backward(dwpe.data(), dyp.data(), first, m, T, C);
    add_bias(yb.data(), bias.data(), m, C);
    auto gyp = Guarded<>::from(yp0), gdwpe = Guarded<>::from(dwpe0), gyb = Guarded<>::from(yp0);
    run(cu::add_position_kernel, blocks(cd::grid_for(m * C)), gyp.get(), wpe.data(), first, m, T,
        C);
    run(cu::position_backward_rows_kernel, blocks(cd::grid_for(T * C)), gdwpe.get(), dyp.data(),
        first, m, T, C);
    run(cu::add_bias_kernel, blocks(cd::grid_for(m * C)), gyb.get(), bias.data(), m, C);
    EXPECT_TRUE(bitwise_equal(gyp.values(), yp)) << "add_position_embedding";
    MT_EXPECT_REL(gdwpe.values(), dwpe, kOrdered, what + " position_embedding_backward");
    EXPECT_TRUE(bitwise_equal(gyb.values(), yb)) << "add_bias";
  }
}

// ---- GELU, elementwise, bf16 --------------------------------------------------------------

TEST(CudaEmulated, GeluMatchesCpu) {
  for (int64_t n : {1, 1003}) {
    const auto x = randn(n, 140, 3.0f), dy = randn(n, 141);
    std::vector<float> y(n), dx(n);
    gelu_forward(y.data(), x.data(), n);
    gelu_backward(dx.data(), x.data(), dy.data(), n);
    Guarded<> gy(n), gdx(n);
    run(cu::gelu_forward_kernel<float>, blocks(cd::grid_for(n)), gy.get(), x.data(), n);
    Guarded<uint16_t> gyb(n);
    run(cu::gelu_forward_kernel<uint16_t>, blocks(cd::grid_for(n)), gyb.get(), x.data(), n);
    emu_test::expect_rounded(gyb.values(), gy.values(), "gelu y in bf16 n=" + std::to_string(n));
    run(cu::gelu_backward_kernel, blocks(cd::grid_for(n)), gdx.get(), x.data(), dy.data(), n);
    MT_EXPECT_REL(gy.values(), y, kF32, "gelu y n=" + std::to_string(n));
    MT_EXPECT_REL(gdx.values(), dx, kF32, "gelu dx n=" + std::to_string(n));
  }
}

TEST(CudaEmulated, ElementwiseIsBitwiseTheCpus) {
  for (int64_t n : {1, 7, 1003}) {
    const auto a = randn(n, 150), b = randn(n, 151);
    std::vector<float> add_ab(n), acc = a, sc = a;
    add(add_ab.data(), a.data(), b.data(), n);
    accumulate(acc.data(), b.data(), n);
    scale(sc.data(), -0.3f, n);
    Guarded<> gadd(n);
    auto galias = Guarded<>::from(a), gacc = Guarded<>::from(a), gsc = Guarded<>::from(a);
    const unsigned g = cd::grid_for(n);
    run(cu::add_kernel, blocks(g), gadd.get(), a.data(), b.data(), n);
    run(cu::add_kernel, blocks(g), galias.get(), galias.get(), b.data(), n);  // y aliases a
    run(cu::accumulate_kernel, blocks(g), gacc.get(), b.data(), n);
    run(cu::scale_kernel, blocks(g), gsc.get(), -0.3f, n);
    EXPECT_TRUE(bitwise_equal(gadd.values(), add_ab)) << "add n=" << n;
    EXPECT_TRUE(bitwise_equal(galias.values(), add_ab)) << "add in place n=" << n;
    EXPECT_TRUE(bitwise_equal(gacc.values(), acc)) << "accumulate n=" << n;
    EXPECT_TRUE(bitwise_equal(gsc.values(), sc)) << "scale n=" << n;
  }
}

TEST(CudaEmulated, Bf16ConversionsAreBitwiseTheCpus) {
  const auto x = test::bf16_conversion_inputs();
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<bf16> want(n);
  to_bf16(want.data(), x.data(), n);
  std::vector<float> back(n);
  to_f32(back.data(), want.data(), n);
  Guarded<uint16_t> gy(n, 0xa5a5);
  run(cu::to_bf16_kernel, blocks(cd::grid_for(n)), gy.get(), x.data(), n);
  const auto got = gy.values();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], want[i].bits) << "to_bf16 of " << x[i];
  Guarded<> gf(n);
  run(cu::to_f32_kernel, blocks(cd::grid_for(n)), gf.get(), got.data(), n);
  const auto gback = gf.values();
  EXPECT_EQ(std::memcmp(gback.data(), back.data(), n * sizeof(float)), 0) << "to_f32";
}

// mixed.cu's bf16-output linear_forward_mixed: the f32 product (the CPU's, standing in for
// cuBLASLt), then bias_round_kernel adds the bias and rounds once. cuda_kernels_test's
// tolerance for bf16 outputs.
TEST(CudaEmulated, BiasRoundMatchesCpu) {
  struct S {
    int64_t n, in, out;
  };
  for (const S s : {S{7, 24, 13}, S{3, 16, 300}})
    for (bool bias : {true, false}) {
      const std::string what = "bias_round n=" + std::to_string(s.n) +
                               " out=" + std::to_string(s.out) + (bias ? "" : " (no bias)");
      const auto x = test::to_bf16_host(randn(s.n * s.in, 130));
      const auto w = test::to_bf16_host(randn(s.out * s.in, 131));
      const auto b = randn(s.out, 132);
      const float* bp = bias ? b.data() : nullptr;
      std::vector<float> acc(s.n * s.out);
      std::vector<bf16> y16(s.n * s.out);
      linear_forward_mixed(acc.data(), x.data(), w.data(), nullptr, s.n, s.in, s.out);
      linear_forward_mixed(y16.data(), x.data(), w.data(), bp, s.n, s.in, s.out);
      Guarded<uint16_t> gy(s.n * s.out, 0xffff);  // a bf16 NaN
      run(cu::bias_round_kernel, blocks(cd::grid_for(s.n * s.out)), gy.get(), acc.data(), bp, s.n,
          s.out);
      const auto got = gy.values();
      std::vector<bf16> got16(got.size());
      for (size_t i = 0; i < got.size(); ++i) got16[i].bits = got[i];
      const auto gotf = test::bf16_to_f32_host(got16);
      EXPECT_EQ(count_nan(gotf), 0) << what;
      MT_EXPECT_REL(gotf, test::bf16_to_f32_host(y16), kBf16Out, what);
    }
}

// ---- device_util.cuh ----------------------------------------------------------------------

// block_reduce with AddOp and MaxOp over a block, and the bf16 helpers, on their own.
__global__ void reduce_probe_kernel(float* sums, float* maxes, const float* x) {
  __shared__ float shm[cd::kThreads];
  const float v = x[blockIdx.x * cd::kThreads + threadIdx.x];
  const float s = cd::block_reduce(v, shm, cd::AddOp{});
  const float m = cd::block_reduce(v, shm, cd::MaxOp{});
  sums[blockIdx.x * cd::kThreads + threadIdx.x] = s;  // every thread gets the result
  maxes[blockIdx.x * cd::kThreads + threadIdx.x] = m;
}

TEST(CudaEmulated, BlockReduceGivesEveryThreadTheTreeResult) {
  const int64_t nb = 2, n = nb * cd::kThreads;
  const auto x = randn(n, 160);
  Guarded<> sums(n), maxes(n);
  run(reduce_probe_kernel, blocks(nb), sums.get(), maxes.get(), x.data());
  const auto s = sums.values(), m = maxes.values();
  for (int64_t b = 0; b < nb; ++b) {
    // The fixed tree: element t adds t + half at each level.
    std::vector<float> tree(x.begin() + b * cd::kThreads, x.begin() + (b + 1) * cd::kThreads);
    for (int h = cd::kThreads / 2; h > 0; h >>= 1)
      for (int t = 0; t < h; ++t) tree[t] += tree[t + h];
    const float mx =
        *std::max_element(x.begin() + b * cd::kThreads, x.begin() + (b + 1) * cd::kThreads);
    for (int t = 0; t < cd::kThreads; ++t) {
      ASSERT_EQ(s[b * cd::kThreads + t], tree[0]) << "block " << b << " thread " << t;
      ASSERT_EQ(m[b * cd::kThreads + t], mx) << "block " << b << " thread " << t;
    }
  }
}

}  // namespace
}  // namespace mt::kernels

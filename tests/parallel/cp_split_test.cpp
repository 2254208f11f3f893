// Context parallelism's pieces (parallel/context.h): the causal load-balanced split, the
// balance of the attention's work it buys (exactly, in the kernel's block pairs), the
// all-gather exchange of one layer against the blockwise kernel on the whole sequence
// (forward and backward, with grouped-query heads), and the refusals before any work.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "comm/launch.h"
#include "core/error.h"
#include "core/memory.h"
#include "kernels/flash_attention.h"
#include "kernels/test_util.h"
#include "parallel/context.h"
#include "train/trainer.h"

namespace mt::parallel::cp {
namespace {

TEST(CpSplit, RankIHoldsChunksIAndTwoNMinusOneMinusI) {
  CpContext c{nullptr, 0, 2, CpComm::kAllGather, false};
  EXPECT_EQ(c.positions(8), (std::vector<int32_t>{0, 1, 6, 7}));
  c.rank = 1;
  EXPECT_EQ(c.positions(8), (std::vector<int32_t>{2, 3, 4, 5}));
  CpContext four{nullptr, 2, 4, CpComm::kAllGather, false};
  EXPECT_EQ(four.positions(16), (std::vector<int32_t>{4, 5, 10, 11}));
  four.contiguous = true;
  EXPECT_EQ(four.positions(16), (std::vector<int32_t>{8, 9, 10, 11}));
  // Every position exactly once over the ranks.
  for (int n : {1, 2, 3, 4, 8}) {
    std::vector<int> seen(96, 0);
    for (int r = 0; r < n; ++r)
      for (int32_t p : CpContext{nullptr, r, n, CpComm::kAllGather, false}.positions(96)) ++seen[p];
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), 96) << "cp " << n;
  }
}

// The kernel's block pairs (R = 128 query rows x K = 256 keys, K = 2R) of one (b, head) per
// rank. With chunks of c = T/2N positions, c a multiple of K, a chunk starting at k·c has
// c/R query blocks and query block j sees k·c/K + ceil((j+1)/2) key blocks: S(c) =
// Σ_j ceil((j+1)/2) = m(m+1) with m = c/K, so chunk k costs (c/R)(k·c/K) + m(m+1) and rank
// i's two chunks
//   (c/R)(c/K)(2N − 1) + 2m(m+1)      the same for every i.
// The contiguous split (rank r holds [r·L, (r+1)·L), L = T/N, M = L/K) costs
//   (L/R)(r·L/K) + M(M+1)             growing with r: the last rank does the most.
TEST(CpSplit, CausalSplitBalancesTheAttentionWorkExactly) {
  constexpr int64_t R = kernels::kFlashQueryBlock, K = kernels::kFlashKeyBlock;
  static_assert(K == 2 * R, "the formulas below");
  const int64_t T = 8192;
  for (int n : {2, 4, 8}) {
    const int64_t c = T / (2 * n), m = c / K, L = T / n, M = L / K;
    const AttentionShape s{1, T, 1, 1, 64, 192, 64};
    int64_t total_balanced = 0, total_plain = 0, worst_plain = 0;
    for (int r = 0; r < n; ++r) {
      CpContext ctx{nullptr, r, n, CpComm::kAllGather, false};
      const int64_t pairs = attention_block_pairs(ctx, s);
      EXPECT_EQ(pairs, (c / R) * (c / K) * (2 * n - 1) + 2 * m * (m + 1)) << "cp " << n;
      total_balanced += pairs;
      // The ring attends chunk by chunk: 2N − 1 whole chunks before a query chunk and 2
      // diagonal ones, the same count.
      CpContext ring = ctx;
      ring.comm = CpComm::kRing;
      EXPECT_EQ(attention_block_pairs(ring, s), pairs) << "ring, cp " << n;
      ctx.contiguous = true;
      const int64_t plain = attention_block_pairs(ctx, s);
      EXPECT_EQ(plain, (L / R) * (r * L / K) + M * (M + 1)) << "cp " << n << " rank " << r;
      total_plain += plain;
      worst_plain = std::max(worst_plain, plain);
    }
    // The same work in all, the whole sequence's.
    const kernels::AttentionPiece whole{1, 1, 64, T, T, 0, 0, true, 0, 1};
    EXPECT_EQ(total_balanced, kernels::flash_attention_block_pairs(whole));
    EXPECT_EQ(total_plain, total_balanced);
    std::printf(
        "cp %d, T %lld: balanced %lld pairs per rank; contiguous worst %lld (%.2fx the mean)\n", n,
        static_cast<long long>(T), static_cast<long long>(total_balanced / n),
        static_cast<long long>(worst_plain),
        static_cast<double>(worst_plain) * n / static_cast<double>(total_plain));
  }
}

// One layer's attention over cp ranks (threads of the local backend) equals the blockwise
// kernel on the whole sequence, row by row, for each exchange: o, lse, dq, and dk | dv of the
// kv heads (grouped-query: 4 query heads on 2 kv heads). a2a keeps the lse of its head group
// over the whole sequence ([B, heads/N, T]).
TEST(CpAttention, ExchangesMatchTheWholeSequence) {
  const int64_t B = 2, T = 600, heads = 4, kvh = 2, hd = 8;  // pieces of 150, 100 and 75 rows
  const int64_t C = heads * hd, Ckv = kvh * hd, ld = C + 2 * Ckv;
  const auto qkv = kernels::test::randn(B * T * ld, 7), dout = kernels::test::randn(B * T * C, 8);
  // The whole sequence: heads repeated into [q | k | v] of C each.
  std::vector<float> full(B * T * 3 * C), o(B * T * C), lse(B * heads * T), dfull(full.size());
  kernels::expand_kv_heads(full.data(), qkv.data(), B * T, heads, kvh, hd);
  kernels::flash_attention_forward(o.data(), lse.data(), full.data(), B, T, C, heads);
  kernels::flash_attention_backward(dfull.data(), dout.data(), full.data(), o.data(), lse.data(), B,
                                    T, C, heads);
  std::vector<float> dqkv(qkv.size());
  kernels::reduce_kv_heads(dqkv.data(), dfull.data(), B * T, heads, kvh, hd);

  const AttentionShape s{B, T, heads, kvh, hd, ld, C};
  for (CpComm comm : {CpComm::kRing, CpComm::kAllGather, CpComm::kA2a})
    for (int n : {2, 3, 4}) {
      if (comm == CpComm::kA2a && kvh % n != 0) continue;  // a2a splits the 2 kv heads
      comm::LaunchOptions lo;
      lo.backend = comm::BackendKind::kLocal;
      lo.world_size = n;
      lo.timeout_s = 60;
      std::vector<double> worst(static_cast<size_t>(n), 0.0);
      comm::launch(lo, [&](comm::Group& world) {
        mem::Tracker tracker;
        mem::ScopedTracker scoped(tracker);
        const CpContext cp = CpContext::of(world, comm);
        const int64_t Tl = T / n;
        const auto pos = cp.positions(T);
        std::vector<float> lq(B * Tl * ld), ldout(B * Tl * C);
        for (int64_t b = 0; b < B; ++b)
          for (int64_t t = 0; t < Tl; ++t) {
            std::copy_n(&qkv[(b * T + pos[t]) * ld], ld, &lq[(b * Tl + t) * ld]);
            std::copy_n(&dout[(b * T + pos[t]) * C], C, &ldout[(b * Tl + t) * C]);
          }
        const WorkspaceElems e = workspace_elems(cp, s);
        std::vector<float> local(e.local), ranked(e.ranked), kv(e.kv), dkv(e.dkv), wo(e.o),
            wl(e.lse);
        const Workspace w{local.data(), ranked.data(), kv.data(), dkv.data(), wo.data(), wl.data()};
        std::vector<float> lo_out(B * Tl * C, 5.0f), llse(B * heads * Tl, 5.0f),
            ldq(lq.size(), 9.0f);  // all overwritten
        attention_forward(cp, s, lq.data(), lo_out.data(), llse.data(), w);
        attention_backward(cp, s, lq.data(), lo_out.data(), llse.data(), ldout.data(), ldq.data(),
                           w);
        double d = 0;
        auto diff = [&](float a, float b) { d = std::max(d, std::abs(double(a) - double(b))); };
        for (int64_t b = 0; b < B; ++b)
          for (int64_t t = 0; t < Tl; ++t) {
            const int64_t gt = b * T + pos[t], lt = b * Tl + t;
            for (int64_t k = 0; k < C; ++k) diff(lo_out[lt * C + k], o[gt * C + k]);
            for (int64_t k = 0; k < ld; ++k) diff(ldq[lt * ld + k], dqkv[gt * ld + k]);
            if (comm != CpComm::kA2a)
              for (int64_t h = 0; h < heads; ++h)
                diff(llse[(b * heads + h) * Tl + t], lse[(b * heads + h) * T + pos[t]]);
          }
        if (comm == CpComm::kA2a) {  // head group r = this rank, every position
          const int64_t hg = heads / n, h0 = world.rank() * hg;
          for (int64_t b = 0; b < B; ++b)
            for (int64_t h = 0; h < hg; ++h)
              for (int64_t t = 0; t < T; ++t)
                diff(llse[(b * hg + h) * T + t], lse[(b * heads + h0 + h) * T + t]);
        }
        worst[static_cast<size_t>(world.rank())] = d;
      });
      // The same terms summed in another order (the ring's merges, pieces' own blocks, the
      // ranks' dk | dv added in the exchange's order): f32 rounding of O(1) values. A wrong
      // position, mask or missing block is off by O(0.1).
      for (int r = 0; r < n; ++r)
        EXPECT_LT(worst[static_cast<size_t>(r)], 1e-5)
            << cp_comm_name(comm) << " cp " << n << " rank " << r;
    }
}

// Refusals before any work, naming the value and the fix.
std::string refusal(const train::TrainOptions& o) {
  try {
    o.validate();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput);
    return e.what();
  }
  return "";
}

TEST(CpRefusals, NameTheValueAndTheFix) {
  train::TrainOptions o;
  o.data = "unused.bin";
  o.model.seq_len = 30;
  o.cp = 4;
  EXPECT_NE(refusal(o).find("--seq 30 is not divisible by 2 x --cp 4 = 8"), std::string::npos)
      << refusal(o);
  EXPECT_NE(refusal(o).find("use --seq 24 or 32"), std::string::npos) << refusal(o);
  o.model.seq_len = 32;
  EXPECT_EQ(refusal(o), "");
  o.attention = "naive";
  EXPECT_NE(refusal(o).find("--attention flash or auto"), std::string::npos) << refusal(o);
  o.attention = "auto";
  o.cp_comm = "ulysses";
  EXPECT_NE(refusal(o).find("--cp-comm 'ulysses'"), std::string::npos) << refusal(o);
  o.cp_comm = "a2a";  // tiny: 4 heads, so cp 4 works; 6 heads below do not split over 4
  EXPECT_EQ(refusal(o), "");
  o.model.n_head = 6;
  o.model.d_model = 96;
  o.model.d_ff = 384;
  EXPECT_NE(refusal(o).find("6 query heads and 6 key/value heads per tp rank do not divide by "
                            "--cp 4 (use --cp among 2, or --cp-comm ring)"),
            std::string::npos)
      << refusal(o);
  o.cp_comm = "ring";
  o.device = "cuda";
  EXPECT_NE(refusal(o).find("runs on the CPU so far"), std::string::npos) << refusal(o);
  o.device = "cpu";
  o.tp = 3;
  o.sp = true;
  o.model.n_head = 6;
  o.model.d_model = 96;
  o.model.d_ff = 384;
  o.cp = 3;
  o.model.seq_len = 42;  // 14 rows per cp rank: not divisible by tp 3
  EXPECT_NE(refusal(o).find("do not split over --tp 3 (use a --seq that is a multiple of 18)"),
            std::string::npos)
      << refusal(o);
}

}  // namespace
}  // namespace mt::parallel::cp

// The blockwise (flash-style) CPU attention against a double-precision reference and the
// naive kernel: forward and backward, causal and not, on shapes that do not divide the
// kernel's blocks (128 query rows, 256 keys), and pieces of the keys merged by their
// log-sum-exp (what context parallelism runs).
#include "kernels/flash_attention.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>

#include "kernels/kernels.h"
#include "kernels/test_util.h"

namespace mt::kernels {
namespace {

using test::randn;
using test::to_double;

// Separate q [B, Tq, C], k and v [B, Tk, C] (head h at columns h·hd), in double.
struct Ref {
  int64_t B, NH, hd, Tq, Tk, q_pos0 = 0, k_pos0 = 0;
  bool causal = true;
  int64_t C() const { return NH * hd; }
  bool sees(int64_t t, int64_t j) const { return !causal || k_pos0 + j <= q_pos0 + t; }
  AttentionPiece piece() const { return {B, NH, hd, Tq, Tk, q_pos0, k_pos0, causal, 0, 1}; }

  // Probabilities [B, NH, Tq, Tk] and lse [B, NH, Tq].
  void probs(const std::vector<double>& q, const std::vector<double>& k, std::vector<double>& p,
             std::vector<double>& lse) const {
    const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
    p.assign(B * NH * Tq * Tk, 0.0);
    lse.assign(B * NH * Tq, -std::numeric_limits<double>::infinity());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < NH; ++h)
        for (int64_t t = 0; t < Tq; ++t) {
          double* row = &p[((b * NH + h) * Tq + t) * Tk];
          double mx = -1e300;
          bool any = false;
          for (int64_t j = 0; j < Tk; ++j) {
            if (!sees(t, j)) continue;
            double s = 0;
            for (int64_t d = 0; d < hd; ++d)
              s += q[(b * Tq + t) * C() + h * hd + d] * k[(b * Tk + j) * C() + h * hd + d];
            row[j] = s * scale;
            mx = std::max(mx, row[j]);
            any = true;
          }
          if (!any) continue;
          double sum = 0;
          for (int64_t j = 0; j < Tk; ++j)
            if (sees(t, j)) sum += (row[j] = std::exp(row[j] - mx));
          for (int64_t j = 0; j < Tk; ++j) row[j] = sees(t, j) ? row[j] / sum : 0.0;
          lse[(b * NH + h) * Tq + t] = mx + std::log(sum);
        }
  }

  std::vector<double> forward(const std::vector<double>& q, const std::vector<double>& k,
                              const std::vector<double>& v, std::vector<double>* lse_out = nullptr,
                              std::vector<double>* p_out = nullptr) const {
    std::vector<double> p, lse, o(B * Tq * C(), 0.0);
    probs(q, k, p, lse);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < NH; ++h)
        for (int64_t t = 0; t < Tq; ++t)
          for (int64_t j = 0; j < Tk; ++j) {
            const double pj = p[((b * NH + h) * Tq + t) * Tk + j];
            for (int64_t d = 0; d < hd; ++d)
              o[(b * Tq + t) * C() + h * hd + d] += pj * v[(b * Tk + j) * C() + h * hd + d];
          }
    if (lse_out) *lse_out = lse;
    if (p_out) *p_out = p;
    return o;
  }

  // Analytic gradients in double: dV = Pᵀ dO, dP = dO Vᵀ, dS = P ∘ (dP − rowsum(P ∘ dP)),
  // dQ = scale·dS K, dK = scale·dSᵀ Q.
  void backward(const std::vector<double>& q, const std::vector<double>& k,
                const std::vector<double>& v, const std::vector<double>& dout,
                std::vector<double>& dq, std::vector<double>& dk, std::vector<double>& dv) const {
    std::vector<double> p, lse;
    probs(q, k, p, lse);
    const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
    dq.assign(q.size(), 0.0);
    dk.assign(k.size(), 0.0);
    dv.assign(v.size(), 0.0);
    std::vector<double> dp(Tk);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < NH; ++h)
        for (int64_t t = 0; t < Tq; ++t) {
          const double* prow = &p[((b * NH + h) * Tq + t) * Tk];
          const double* g = &dout[(b * Tq + t) * C() + h * hd];
          double dot = 0;
          for (int64_t j = 0; j < Tk; ++j) {
            double s = 0;
            for (int64_t d = 0; d < hd; ++d) s += g[d] * v[(b * Tk + j) * C() + h * hd + d];
            dp[j] = s;
            dot += prow[j] * s;
          }
          for (int64_t j = 0; j < Tk; ++j) {
            const double ds = prow[j] * (dp[j] - dot) * scale;
            for (int64_t d = 0; d < hd; ++d) {
              dv[(b * Tk + j) * C() + h * hd + d] += prow[j] * g[d];
              dq[(b * Tq + t) * C() + h * hd + d] += ds * k[(b * Tk + j) * C() + h * hd + d];
              dk[(b * Tk + j) * C() + h * hd + d] += ds * q[(b * Tq + t) * C() + h * hd + d];
            }
          }
        }
  }
};

// The flash kernel on separate q, k, v buffers (rows C floats apart).
struct FlashRun {
  std::vector<float> o, lse, dq, dk, dv;
};
FlashRun run_flash(const Ref& r, const std::vector<float>& q, const std::vector<float>& k,
                   const std::vector<float>& v, const std::vector<float>* dout) {
  const int64_t C = r.C();
  FlashRun out;
  out.o.assign(r.B * r.Tq * C, 7.0f);  // overwritten
  out.lse.assign(r.B * r.NH * r.Tq, 7.0f);
  const HeadRows qr{q.data(), C, r.Tq * C}, kr{k.data(), C, r.Tk * C}, vr{v.data(), C, r.Tk * C};
  flash_attention_forward(r.piece(), qr, kr, vr, {out.o.data(), C, r.Tq * C}, out.lse.data());
  if (!dout) return out;
  out.dq.assign(q.size(), 0.0f);
  out.dk.assign(k.size(), 0.0f);
  out.dv.assign(v.size(), 0.0f);
  flash_attention_backward(r.piece(), qr, kr, vr, {out.o.data(), C, r.Tq * C},
                           {dout->data(), C, r.Tq * C}, out.lse.data(),
                           {out.dq.data(), C, r.Tq * C}, {out.dk.data(), C, r.Tk * C},
                           {out.dv.data(), C, r.Tk * C});
  return out;
}

// The double reference's analytic backward against finite differences of its forward, so
// that the checks below compare the kernel with a trusted gradient.
TEST(FlashAttention, ReferenceBackwardMatchesFiniteDifferences) {
  for (bool causal : {true, false}) {
    Ref r{1, 2, 3, 5, 7, 4, 1, causal};  // query positions 4..8, keys 1..7
    const auto q = to_double(randn(r.B * r.Tq * r.C(), 11)),
               k = to_double(randn(r.B * r.Tk * r.C(), 12)),
               v = to_double(randn(r.B * r.Tk * r.C(), 13)),
               g = to_double(randn(r.B * r.Tq * r.C(), 14));
    std::vector<double> dq, dk, dv;
    r.backward(q, k, v, g, dq, dk, dv);
    auto num_q =
        test::numeric_grad(q, [&](const auto& x) { return test::dot(g, r.forward(x, k, v)); });
    auto num_k =
        test::numeric_grad(k, [&](const auto& x) { return test::dot(g, r.forward(q, x, v)); });
    auto num_v =
        test::numeric_grad(v, [&](const auto& x) { return test::dot(g, r.forward(q, k, x)); });
    // Both in double: central differences are exact to ~1e-9 here (test_util.h).
    for (size_t i = 0; i < dq.size(); ++i) EXPECT_NEAR(dq[i], num_q[i], 1e-7);
    for (size_t i = 0; i < dk.size(); ++i) EXPECT_NEAR(dk[i], num_k[i], 1e-7);
    for (size_t i = 0; i < dv.size(); ++i) EXPECT_NEAR(dv[i], num_v[i], 1e-7);
  }
}

// Tolerances for the f32 kernel against double: scores are dot products of hd N(0,1)
// values scaled by 1/√hd (O(1)), the exp is a polynomial good to ~2 ulp, and every output is
// a sum of <= Tk terms accumulated in f32 over blocks: the error grows like Tk·2^-24 ≈ 2e-5
// for Tk = 333 in the worst case, ~1e-6 typically. 2e-5 absolute + 1e-4 relative leaves
// room and still fails for any wrong mask, block edge or rescale (errors of O(0.1)).
constexpr double kAtol = 2e-5, kRtol = 1e-4;

void check_against_reference(const Ref& r, uint32_t seed) {
  const auto q = randn(r.B * r.Tq * r.C(), seed), k = randn(r.B * r.Tk * r.C(), seed + 1),
             v = randn(r.B * r.Tk * r.C(), seed + 2), g = randn(r.B * r.Tq * r.C(), seed + 3);
  const FlashRun f = run_flash(r, q, k, v, &g);
  std::vector<double> lse, dq, dk, dv;
  const auto o = r.forward(to_double(q), to_double(k), to_double(v), &lse);
  r.backward(to_double(q), to_double(k), to_double(v), to_double(g), dq, dk, dv);
  test::expect_close(f.o, o, kAtol, kRtol, "o");
  // lse is O(log Tk + max score) ~ 5: relative 1e-6 is ~10 ulp.
  for (size_t i = 0; i < lse.size(); ++i)
    if (std::isinf(lse[i]))
      EXPECT_TRUE(std::isinf(f.lse[i]) && f.lse[i] < 0) << "lse[" << i << "] " << f.lse[i];
    else
      EXPECT_NEAR(f.lse[i], lse[i], 1e-5 * (1 + std::fabs(lse[i]))) << "lse[" << i << "]";
  test::expect_close(f.dq, dq, kAtol, kRtol, "dq");
  test::expect_close(f.dk, dk, kAtol, kRtol, "dk");
  test::expect_close(f.dv, dv, kAtol, kRtol, "dv");
}

TEST(FlashAttention, CausalMatchesDoubleReference) {
  // T = 150: query blocks 128, 22 (one key block). T = 300: query blocks 128, 128, 44; key
  // blocks 256, 44.
  check_against_reference({2, 3, 8, 150, 150, 0, 0, true}, 21);
  check_against_reference({1, 2, 16, 300, 300, 0, 0, true}, 31);
}

TEST(FlashAttention, NonCausalMatchesDoubleReference) {
  check_against_reference({2, 2, 8, 70, 333, 0, 0, false}, 41);
  check_against_reference({1, 3, 4, 200, 5, 0, 0, false}, 51);
}

TEST(FlashAttention, OffsetCausalPiecesMatchDoubleReference) {
  // Queries at positions 200..329 against keys 0..249 (the diagonal crosses both blocks);
  // keys 300..399 (rows before position 300 see nothing: lse -inf, o 0, no gradient).
  check_against_reference({1, 2, 8, 130, 250, 200, 0, true}, 61);
  check_against_reference({2, 1, 8, 130, 100, 200, 300, true}, 71);
}

// The kernel on the model's layout equals the naive kernel, forward and backward (both f32:
// the same sums in another order).
TEST(FlashAttention, ModelLayoutMatchesNaiveKernel) {
  for (int64_t T : {1, 63, 150, 257}) {
    const int64_t B = 2, NH = 3, C = 24;
    const auto qkv = randn(B * T * 3 * C, 81 + T), dout = randn(B * T * C, 82 + T);
    std::vector<float> on(B * T * C), att(B * NH * T * T), scratch(B * NH * T * T), dn(qkv.size());
    attention_forward(on.data(), att.data(), qkv.data(), B, T, C, NH);
    attention_backward(dn.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
    std::vector<float> of(B * T * C), lse(B * NH * T), df(qkv.size(), 5.0f);  // df overwritten
    flash_attention_forward(of.data(), lse.data(), qkv.data(), B, T, C, NH);
    flash_attention_backward(df.data(), dout.data(), qkv.data(), of.data(), lse.data(), B, T, C,
                             NH);
    test::expect_close(of, to_double(on), kAtol, kRtol, "out vs naive");
    test::expect_close(df, to_double(dn), kAtol, kRtol, "dqkv vs naive");
  }
}

// Keys split into pieces, each attended separately and merged by log-sum-exp, equal the
// whole; the pieces' backward with the merged o and lse sum to the whole's gradients.
TEST(FlashAttention, PiecesMergeToTheWhole) {
  const Ref whole{2, 2, 8, 96, 300, 204, 0, true};  // queries at 204..299
  const int64_t C = whole.C();
  const auto q = randn(whole.B * whole.Tq * C, 91), k = randn(whole.B * whole.Tk * C, 92),
             v = randn(whole.B * whole.Tk * C, 93), g = randn(whole.B * whole.Tq * C, 94);
  const FlashRun all = run_flash(whole, q, k, v, &g);
  const int64_t cuts[] = {0, 70, 130, 250, 300};  // the last piece is partly masked
  std::vector<float> o(all.o.size()), lse(all.lse.size(), -std::numeric_limits<float>::infinity());
  std::vector<float> o2(o.size()), lse2(lse.size());
  std::fill(o.begin(), o.end(), 0.0f);
  auto piece_of = [&](int i) {
    AttentionPiece p = whole.piece();
    p.Tk = cuts[i + 1] - cuts[i];
    p.k_pos0 = cuts[i];
    return p;
  };
  for (int i = 0; i < 4; ++i) {
    const AttentionPiece p = piece_of(i);
    const int64_t j0 = cuts[i];
    flash_attention_forward(p, {q.data(), C, whole.Tq * C}, {k.data() + j0 * C, C, whole.Tk * C},
                            {v.data() + j0 * C, C, whole.Tk * C}, {o2.data(), C, whole.Tq * C},
                            lse2.data());
    attention_merge(p, {o.data(), C, whole.Tq * C}, lse.data(), {o2.data(), C, whole.Tq * C},
                    lse2.data());
  }
  // Merging reorders f32 sums of the same terms: a few ulp of O(1) values.
  test::expect_close(o, to_double(all.o), 1e-6, 1e-5, "merged o");
  test::expect_close(lse, to_double(all.lse), 1e-6, 1e-6, "merged lse");
  std::vector<float> dq(q.size(), 0.0f), dk(k.size(), 0.0f), dv(v.size(), 0.0f);
  for (int i = 0; i < 4; ++i) {
    const AttentionPiece p = piece_of(i);
    const int64_t j0 = cuts[i];
    flash_attention_backward(p, {q.data(), C, whole.Tq * C}, {k.data() + j0 * C, C, whole.Tk * C},
                             {v.data() + j0 * C, C, whole.Tk * C}, {o.data(), C, whole.Tq * C},
                             {g.data(), C, whole.Tq * C}, lse.data(), {dq.data(), C, whole.Tq * C},
                             {dk.data() + j0 * C, C, whole.Tk * C},
                             {dv.data() + j0 * C, C, whole.Tk * C});
  }
  test::expect_close(dq, to_double(all.dq), 1e-5, 1e-4, "dq of pieces");
  test::expect_close(dk, to_double(all.dk), 1e-5, 1e-4, "dk of pieces");
  test::expect_close(dv, to_double(all.dv), 1e-5, 1e-4, "dv of pieces");
}

TEST(FlashAttention, SameBitsOnAnyThreadCount) {
  const Ref r{2, 4, 16, 200, 200, 0, 0, true};
  const auto q = randn(r.B * r.Tq * r.C(), 101), k = randn(r.B * r.Tk * r.C(), 102),
             v = randn(r.B * r.Tk * r.C(), 103), g = randn(r.B * r.Tq * r.C(), 104);
  const int before = omp_get_max_threads();
  omp_set_num_threads(1);
  const FlashRun one = run_flash(r, q, k, v, &g);
  omp_set_num_threads(std::min(2, omp_get_thread_limit()));
  const FlashRun two = run_flash(r, q, k, v, &g);
  const FlashRun again = run_flash(r, q, k, v, &g);
  omp_set_num_threads(before);
  EXPECT_EQ(one.o, two.o);
  EXPECT_EQ(one.lse, two.lse);
  EXPECT_EQ(one.dq, two.dq);
  EXPECT_EQ(one.dk, two.dk);
  EXPECT_EQ(one.dv, two.dv);
  EXPECT_EQ(two.dq, again.dq);
}

// The work the forward does: causal skips whole key blocks above the diagonal.
TEST(FlashAttention, CausalSkipsBlocksAboveTheDiagonal) {
  static_assert(kFlashQueryBlock == 128 && kFlashKeyBlock == 256, "the counts below");
  // T = 512: query blocks [0,128) [128,256) [256,384) [384,512) see keys up to 128, 256, 384,
  // 512: 1 + 1 + 2 + 2 key blocks of 256. Non-causal: 4 x 2.
  EXPECT_EQ(flash_attention_block_pairs({1, 1, 8, 512, 512, 0, 0, true, 0, 1}), 6);
  EXPECT_EQ(flash_attention_block_pairs({1, 1, 8, 512, 512, 0, 0, false, 0, 1}), 8);
  EXPECT_EQ(flash_attention_block_pairs({2, 3, 8, 512, 512, 0, 0, true, 0, 1}), 36);
  // Queries at 0..127 against keys at 128..383: nothing visible.
  EXPECT_EQ(flash_attention_block_pairs({1, 1, 8, 128, 256, 0, 128, true, 0, 1}), 0);
}

// The per-thread switch: attention_forward runs the blockwise kernel (att = lse) while it is
// on; attention_backward refuses (its backward reads the output).
TEST(FlashAttention, PerThreadSwitch) {
  const int64_t B = 1, T = 70, NH = 2, C = 16;
  const auto qkv = randn(B * T * 3 * C, 111);
  EXPECT_EQ(attention_stash_elems(B, NH, T), B * NH * T * T);
  set_fused_attention(true);
  EXPECT_EQ(attention_stash_elems(B, NH, T), B * NH * T);
  std::vector<float> o1(B * T * C), lse1(B * NH * T), o2(o1.size()), lse2(lse1.size());
  attention_forward(o1.data(), lse1.data(), qkv.data(), B, T, C, NH);
  std::vector<float> d(qkv.size()), s(1);
  EXPECT_THROW(
      attention_backward(d.data(), s.data(), o1.data(), qkv.data(), lse1.data(), B, T, C, NH),
      Error);
  set_fused_attention(false);
  flash_attention_forward(o2.data(), lse2.data(), qkv.data(), B, T, C, NH);
  EXPECT_EQ(o1, o2);
  EXPECT_EQ(lse1, lse2);
}

}  // namespace
}  // namespace mt::kernels

// The mixture-of-experts layer: the router's choices, capacity and order against hand-worked
// cases; the balancing losses against their formulas; the router's backward and the whole
// MoE model's gradients against central finite differences, with the routing held fixed
// (top-k is not differentiable: each finite difference checks that no choice flipped).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/philox.h"
#include "kernels/kernels.h"
#include "model/gpt.h"
#include "model/moe_routing.h"
#include "model/routing_tape.h"

namespace mt::model {
namespace {

struct RoutingBuffers {
  std::vector<float> probs, lse, gate;
  std::vector<int32_t> expert, slot, order;
  std::vector<int64_t> counts, routed;
  Routing r;
  RoutingBuffers(int64_t n, int64_t e, int64_t k)
      : probs(n * e), lse(n), gate(n * k), expert(n * k), slot(n * k), order(n * k) {
    r.n = n;
    r.e = e;
    r.k = k;
    r.probs = probs.data();
    r.lse = lse.data();
    r.gate = gate.data();
    r.expert = expert.data();
    r.slot = slot.data();
    r.order = order.data();
    r.counts = &counts;
    r.routed = &routed;
  }
};

TEST(MoeRouting, TopKGatesAndTheExpertSortedOrder) {
  // 3 tokens, 4 experts, top 2.
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f,  0.0f,   // -> 1, 2
                                     0.5f, 0.1f, 0.2f,  0.9f,   // -> 3, 0
                                     2.0f, 2.0f, -1.0f, 1.0f};  // tie -> 0 (lower index), 1
  RoutingBuffers b(3, 4, 2);
  route(b.r, logits.data(), {});
  EXPECT_EQ(b.expert, (std::vector<int32_t>{1, 2, 3, 0, 0, 1}));
  // Mixtral's gates: the chosen probabilities renormalised = softmax over the chosen logits.
  EXPECT_NEAR(b.gate[0], 1 / (1 + std::exp(-1.0)), 1e-6);
  EXPECT_NEAR(b.gate[1], 1 / (1 + std::exp(1.0)), 1e-6);
  EXPECT_NEAR(b.gate[4], 0.5, 1e-6);
  // Expert-sorted rows: expert 0 {t1, t2}, 1 {t0, t2}, 2 {t0}, 3 {t1}.
  EXPECT_EQ(b.counts, (std::vector<int64_t>{2, 2, 1, 1}));
  EXPECT_EQ(b.r.kept, 6);
  EXPECT_EQ(b.order, (std::vector<int32_t>{3, 4, 0, 5, 1, 2}));
  for (int64_t row = 0; row < 6; ++row) EXPECT_EQ(b.slot[b.order[row]], row);
  // The probabilities are the softmax over all experts; lse its normaliser.
  double s = 0;
  for (int i = 0; i < 4; ++i) s += std::exp(static_cast<double>(logits[i]));
  EXPECT_NEAR(b.lse[0], std::log(s), 1e-6);
  EXPECT_NEAR(b.probs[1], std::exp(3.0) / s, 1e-6);
}

// Under mpirun each process records its microbatches and rank 0 merges the words of all:
// the merged tape finds every entry as recorded (a sample above 2^32 included), a second
// process's differing record of the same microbatch is refused, and so are cut words.
TEST(RoutingTape, SerializedTapesMergeIntoTheSameEntries) {
  RoutingTape a, b;
  const int32_t e1[4] = {3, 1, 0, 2}, s1[4] = {0, -1, 1, 2};
  const int32_t e2[2] = {5, 4}, s2[2] = {-1, 0};
  const int64_t big = (int64_t{1} << 33) + 7;
  a.record(0, 1, e1, s1, 4);
  b.record(big, 0, e2, s2, 2);
  std::vector<int32_t> words = a.serialize();
  const std::vector<int32_t> more = b.serialize();
  words.insert(words.end(), more.begin(), more.end());
  RoutingTape merged;
  merged.merge(words);
  ASSERT_EQ(merged.size(), 2u);
  const RoutingTape::Entry& x = merged.find(0, 1, 4);
  EXPECT_EQ(x.expert, std::vector<int32_t>(e1, e1 + 4));
  EXPECT_EQ(x.dropped, (std::vector<uint8_t>{0, 1, 0, 0}));
  const RoutingTape::Entry& y = merged.find(big, 0, 2);
  EXPECT_EQ(y.expert, std::vector<int32_t>(e2, e2 + 2));
  EXPECT_EQ(y.dropped, (std::vector<uint8_t>{1, 0}));
  merged.merge(more);  // the same record again (tp ranks): kept once
  EXPECT_EQ(merged.size(), 2u);
  RoutingTape other;
  const int32_t e3[2] = {4, 5};
  other.record(big, 0, e3, s2, 2);
  EXPECT_THROW(merged.merge(other.serialize()), Error) << "a differing record of one microbatch";
  std::vector<int32_t> cut = a.serialize();
  cut.pop_back();
  EXPECT_THROW(RoutingTape().merge(cut), Error) << "words cut inside an entry";
  cut.resize(3);
  EXPECT_THROW(RoutingTape().merge(cut), Error) << "words cut inside a header";
}

// Context parallelism: each cp rank records its rows of the microbatch (cp 2 of one sequence
// of 8: rank 0 holds rows 0, 1, 6, 7 and rank 1 rows 2..5); the pieces merge into the whole
// microbatch's routing, also through serialize/merge (under mpirun), and a tape missing a
// piece, or two pieces that disagree on a row, are refused.
TEST(RoutingTape, ContextParallelPiecesMergeIntoTheWholeMicrobatch) {
  const int64_t k = 2;
  // Rank r's local token t chose experts {10 r + t, 10 r + t + 5}; rank 1's token 2 dropped one.
  auto piece = [&](int r, std::vector<int32_t>& e, std::vector<int32_t>& s) {
    for (int t = 0; t < 4; ++t)
      for (int j = 0; j < k; ++j) {
        e.push_back(10 * r + t + 5 * j);
        s.push_back(r == 1 && t == 2 && j == 1 ? -1 : 0);
      }
  };
  const std::vector<int64_t> rows0 = {0, 1, 6, 7}, rows1 = {2, 3, 4, 5};
  std::vector<int32_t> e0, s0, e1, s1;
  piece(0, e0, s0);
  piece(1, e1, s1);
  RoutingTape half;
  half.record_rows(3, 0, e0.data(), s0.data(), k, rows0, 8);
  EXPECT_THROW(half.find(3, 0, 16), Error) << "rank 1's rows are missing";
  RoutingTape other;
  other.record_rows(3, 0, e1.data(), s1.data(), k, rows1, 8);
  half.merge(other.serialize());
  const RoutingTape::Entry& w = half.find(3, 0, 16);
  const std::vector<int32_t> want = {0, 5, 1, 6, 10, 15, 11, 16, 12, 17, 13, 18, 2, 7, 3, 8};
  EXPECT_EQ(w.expert, want);
  std::vector<uint8_t> dropped(16, 0);
  dropped[2 * 4 + 1] = 1;  // rank 1's token 2 is row 4
  EXPECT_EQ(w.dropped, dropped);
  // A piece recorded again by a tp rank of the same cp rank is the same: kept once.
  half.record_rows(3, 0, e0.data(), s0.data(), k, rows0, 8);
  EXPECT_EQ(half.size(), 1u);
  // Two pieces claiming the same row with other experts (a wrong position map) are refused.
  RoutingTape clash;
  clash.record_rows(3, 0, e0.data(), s0.data(), k, rows0, 8);
  EXPECT_THROW(clash.record_rows(3, 0, e1.data(), s1.data(), k, {0, 1, 2, 3}, 8), Error);
}

// capacity_drops (context parallelism's decision on the gathered pieces) is route's own rule:
// on random logits at capacities that drop, the same assignments.
TEST(MoeRouting, CapacityDropsIsRoutesRule) {
  const int64_t n = 64, e = 4, k = 2;
  std::vector<float> logits(n * e);
  uint32_t h = 12345;
  for (float& v : logits) {
    h = h * 1664525u + 1013904223u;
    v = static_cast<float>(h >> 8) / 16777216.0f * 4.0f - 2.0f;
  }
  for (double c : {0.5, 0.75, 1.0}) {
    RoutingBuffers b(n, e, k);
    RouteOptions o;
    o.capacity_factor = c;
    route(b.r, logits.data(), o);
    const std::vector<int32_t>& expert = b.expert;
    const std::vector<int32_t>& slot = b.slot;
    std::vector<float> prob(n * k);
    for (int64_t a = 0; a < n * k; ++a) prob[a] = b.probs[a / k * e + expert[a]];
    std::vector<uint8_t> dropped(n * k);
    capacity_drops(dropped.data(), expert.data(), prob.data(), n, k, e, c);
    int64_t drops = 0;
    for (int64_t a = 0; a < n * k; ++a) {
      EXPECT_EQ(dropped[a] == 1, slot[a] < 0) << "capacity " << c << ", assignment " << a;
      drops += dropped[a];
    }
    EXPECT_GT(drops, 0) << "capacity " << c << " drops something";
  }
}

TEST(MoeRouting, TheTwoOrdersGiveTheSameGatesToRounding) {
  const int64_t n = 64, e = 8, k = 2;
  std::vector<float> logits(n * e);
  for (int64_t i = 0; i < n * e; ++i) logits[i] = rng::normal(3, 1, i) * 3;
  RoutingBuffers a(n, e, k), b(n, e, k);
  route(a.r, logits.data(), {RouterOrder::kSoftmaxTopK, 0, nullptr});
  route(b.r, logits.data(), {RouterOrder::kTopKSoftmax, 0, nullptr});
  EXPECT_EQ(a.expert, b.expert);
  for (int64_t i = 0; i < n * k; ++i) EXPECT_NEAR(a.gate[i], b.gate[i], 2e-7) << i;
}

TEST(MoeRouting, CapacityDropsTheLowestProbabilityThenTheLaterToken) {
  // 4 tokens, 2 experts, top 1, capacity factor 1: ceil(1 · 4 · 1 / 2) = 2 per expert.
  // All four prefer expert 0; by probability: t2 > t0 = t3 > t1. Kept: t2, then t0 (the
  // earlier of the tie); dropped: t3 and t1.
  const std::vector<float> logits = {1.0f, 0.0f, 0.5f, 0.0f, 3.0f, 0.0f, 1.0f, 0.0f};
  RoutingBuffers b(4, 2, 1);
  route(b.r, logits.data(), {RouterOrder::kSoftmaxTopK, 1.0, nullptr});
  EXPECT_EQ(expert_capacity(1.0, 4, 1, 2), 2);
  EXPECT_EQ(b.routed, (std::vector<int64_t>{4, 0}));
  EXPECT_EQ(b.counts, (std::vector<int64_t>{2, 0}));
  EXPECT_GE(b.slot[0], 0);
  EXPECT_EQ(b.slot[1], -1);
  EXPECT_GE(b.slot[2], 0);
  EXPECT_EQ(b.slot[3], -1);
  // Dropless keeps them all.
  route(b.r, logits.data(), {});
  EXPECT_EQ(b.r.kept, 4);
}

TEST(MoeRouting, SelectionBiasChoosesButDoesNotWeigh) {
  const std::vector<float> logits = {2.0f, 1.0f, 0.0f};
  const std::vector<float> bias = {0.0f, 0.0f, 1.0f};  // expert 2 boosted past expert 1
  RoutingBuffers b(1, 3, 2);
  route(b.r, logits.data(), {RouterOrder::kSoftmaxTopK, 0, bias.data()});
  EXPECT_EQ(b.expert, (std::vector<int32_t>{2, 0}));
  // Gates from the probabilities alone: p2 / (p0 + p2) = 1 / (1 + e²).
  EXPECT_NEAR(b.gate[0], 1 / (1 + std::exp(2.0)), 1e-6);
}

TEST(MoeRouting, BalanceLossesFollowTheirFormulas) {
  const int64_t n = 16, e = 4, k = 2;
  std::vector<float> logits(n * e);
  for (int64_t i = 0; i < n * e; ++i) logits[i] = rng::normal(4, 1, i);
  RoutingBuffers b(n, e, k);
  route(b.r, logits.data(), {});
  const BalanceLosses l = balance_losses(b.r);
  // Switch: E · Σᵢ fᵢ Pᵢ, fᵢ = routed_i / (n k), Pᵢ = mean_t p_ti (written out again here).
  double aux = 0, z = 0;
  for (int64_t i = 0; i < e; ++i) {
    double P = 0;
    for (int64_t t = 0; t < n; ++t) P += b.probs[t * e + i] / n;
    aux += static_cast<double>(b.routed[i]) / (n * k) * P;
  }
  aux *= e;
  for (int64_t t = 0; t < n; ++t) {
    double s = 0;
    for (int64_t i = 0; i < e; ++i) s += std::exp(static_cast<double>(logits[t * e + i]));
    z += std::log(s) * std::log(s) / n;
  }
  EXPECT_NEAR(l.aux, aux, 1e-6);
  EXPECT_NEAR(l.z, z, 1e-5);
  // Perfect balance: uniform probabilities and equal loads give exactly 1.
  std::vector<float> flat(4 * 2, 0.f);  // 4 tokens, 2 experts, top 1: ties -> expert 0
  RoutingBuffers u(4, 2, 1);
  route(u.r, flat.data(), {});
  EXPECT_NEAR(balance_losses(u.r).aux, 2 * (1.0 * 0.5), 1e-7);  // all on expert 0: f=(1,0)
}

TEST(MoeRouting, BackwardMatchesFiniteDifferencesWithTheChoicesHeld) {
  // L = Σ c_tj g_tj + α aux + β z, with the routing's choices and loads held fixed.
  const int64_t n = 12, e = 5, k = 2;
  const double alpha = 0.3, beta = 0.2;
  std::vector<float> logits(n * e), c(n * k);
  for (int64_t i = 0; i < n * e; ++i) logits[i] = rng::normal(5, 1, i) * 2;
  for (int64_t i = 0; i < n * k; ++i) c[i] = rng::normal(5, 2, i);
  RoutingBuffers b(n, e, k);
  route(b.r, logits.data(), {});
  const std::vector<int32_t> chosen = b.expert;
  auto loss = [&](const std::vector<float>& l) {
    RoutingBuffers x(n, e, k);
    route(x.r, l.data(), {});
    EXPECT_EQ(x.expert, chosen) << "a finite difference flipped a choice";
    double s = 0;
    for (int64_t i = 0; i < n * k; ++i) s += c[i] * static_cast<double>(x.gate[i]);
    // aux with the loads (fᵢ) of the unperturbed routing: they are counts, held fixed.
    double aux = 0;
    for (int64_t i = 0; i < e; ++i) {
      double P = 0;
      for (int64_t t = 0; t < n; ++t) P += x.probs[t * e + i] / static_cast<double>(n);
      aux += static_cast<double>(b.routed[i]) / (n * k) * P;
    }
    return s + alpha * e * aux + beta * balance_losses(x.r).z;
  };
  std::vector<float> dl(n * e);
  route_backward(dl.data(), c.data(), b.r, alpha, beta);
  // eps 1e-3 on logits of order 1: truncation ~1e-6, f32 rounding of the sums ~1e-7 / 2e-3.
  const double eps = 1e-3;
  for (int64_t i = 0; i < n * e; ++i) {
    std::vector<float> p = logits, m = logits;
    p[i] += static_cast<float>(eps);
    m[i] -= static_cast<float>(eps);
    const double numeric = (loss(p) - loss(m)) / (2 * eps);
    EXPECT_NEAR(dl[i], numeric, 2e-4 + 1e-3 * std::abs(numeric)) << i;
  }
}

// A small MoE model: 2 blocks, both MoE (or only the second with every = 2).
GptConfig small_moe(bool llama, int64_t shared, int64_t every) {
  GptConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 16;
  c.d_ff = 24;
  c.vocab = 37;
  c.seq_len = 8;
  c.bias = !llama;
  c.tied = !llama;
  if (llama) {
    c.n_head = 4;
    c.n_kv_head = 2;
    c.norm = NormKind::kRmsNorm;
    c.mlp = MlpKind::kSwiGlu;
    c.positions = Positions::kRope;
  }
  c.moe.n_experts = 4;
  c.moe.top_k = 2;
  c.moe.d_ff_expert = 12;
  c.moe.d_ff_shared = shared;
  c.moe.every = every;
  return c;
}

// The total loss the backward differentiates: the LM loss plus each MoE layer's weighted
// balancing losses (weight 1 here: dloss = 1/N, times the N tokens).
double total_loss(Gpt& gpt, Activations& a, const std::vector<int32_t>& in,
                  const std::vector<int32_t>& tgt) {
  double l = gpt.forward(a, in.data(), tgt.data());
  const MoeOptions& o = gpt.moe_options();
  for (int i = 0; i < gpt.num_blocks(); ++i)
    if (gpt.block(i).is_moe)
      l += o.aux_loss * a.blocks[static_cast<size_t>(i)].moe.losses.aux +
           o.z_loss * a.blocks[static_cast<size_t>(i)].moe.losses.z;
  return l;
}

// Each token's chosen experts (as a set: two whose probabilities swap rank give the same
// function) and whether each was dropped.
std::vector<int32_t> choices(const Gpt& gpt, const Activations& a) {
  std::vector<int32_t> v;
  for (int i = 0; i < gpt.num_blocks(); ++i) {
    if (!gpt.block(i).is_moe) continue;
    const BlockActivations& b = a.blocks[static_cast<size_t>(i)];
    const int32_t* e = b.moe.expert.data<int32_t>();
    const int32_t* s = b.moe.slot.data<int32_t>();
    const int64_t k = b.moe.expert.shape()[1];
    for (int64_t t = 0; t < b.moe.expert.shape()[0]; ++t) {
      std::vector<std::pair<int32_t, int32_t>> chosen;
      for (int64_t j = 0; j < k; ++j) chosen.push_back({e[t * k + j], s[t * k + j] < 0 ? 1 : 0});
      std::sort(chosen.begin(), chosen.end());
      for (auto [x, dropped] : chosen) {
        v.push_back(x);
        v.push_back(dropped);
      }
    }
  }
  return v;
}

void check_moe_gradient(const GptConfig& c, const MoeOptions& o) {
  kernels::set_threads(1);
  Gpt gpt(c, 42);
  gpt.set_moe_options(o);
  for (auto& p : gpt.params().params())
    if (p.spec.init == Init::kNormal)
      for (int64_t i = 0; i < p.value.numel(); ++i) p.value.f32()[i] *= 10.f;
  const int64_t B = 2, T = 8, N = B * T;
  std::vector<int32_t> in(N), tgt(N);
  for (int64_t i = 0; i < N; ++i) {
    in[i] = static_cast<int32_t>(rng::uniform(1, 1, i) * c.vocab);
    tgt[i] = static_cast<int32_t>(rng::uniform(1, 2, i) * c.vocab);
  }
  Activations a = gpt.make_activations(B, T);
  gpt.params().zero_grads();
  total_loss(gpt, a, in, tgt);
  const std::vector<int32_t> routed = choices(gpt, a);
  gpt.backward(a, 1.0f / static_cast<float>(N));
  int checked = 0;
  for (auto& p : gpt.params().params()) {
    const int64_t n = p.value.numel();
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = rng::normal(7, rng::stream_of(p.spec.name), i);
    if (p.spec.real_rows >= 0)
      for (int64_t i = p.spec.real_rows * p.spec.shape[1]; i < n; ++i) v[i] = 0;
    double norm = 0, analytic = 0;
    for (float x : v) norm += static_cast<double>(x) * x;
    norm = std::sqrt(norm);
    for (int64_t i = 0; i < n; ++i) analytic += static_cast<double>(p.grad.f32()[i]) * v[i];
    analytic /= norm;
    // eps along a unit direction, as in gpt_gradient_test: 1e-2 keeps the truncation error
    // near 1e-4; a routing choice that flips under it is reported, not averaged over.
    const double eps = 1e-2;
    std::vector<float> saved(p.value.f32(), p.value.f32() + n);
    auto loss_at = [&](double s) {
      for (int64_t i = 0; i < n; ++i)
        p.value.f32()[i] = saved[i] + static_cast<float>(s * v[i] / norm);
      const double l = total_loss(gpt, a, in, tgt);
      EXPECT_EQ(choices(gpt, a), routed) << p.spec.name << ": a routing choice flipped at " << s;
      return l;
    };
    const double numeric = (loss_at(eps) - loss_at(-eps)) / (2 * eps);
    loss_at(0);
    EXPECT_NEAR(analytic, numeric, 1e-3 + 1e-2 * std::abs(numeric)) << p.spec.name;
    checked += p.spec.name.find("moe.") != std::string::npos;
  }
  EXPECT_GE(checked, 3);  // the router and both experts' weights at least
}

TEST(MoeGradient, MixtralShapedMatchesFiniteDifferences) {
  check_moe_gradient(small_moe(true, 0, 1), {0, 0, 0});
}
TEST(MoeGradient, WithBalancingLossesAndASharedExpert) {
  check_moe_gradient(small_moe(true, 8, 1), {0, 0.1, 0.01});
}
TEST(MoeGradient, Gpt2StyleGeluExpertsWithBiasesDroppingAtCapacityOne) {
  MoeOptions o;
  o.capacity_factor = 1.0;
  o.aux_loss = 0.05;
  check_moe_gradient(small_moe(false, 0, 2), o);
}

TEST(MoeParams, MixtralCountsAndLayers) {
  // Mixtral 8x7B: 46,702,792,704 parameters (Hugging Face num_parameters()).
  EXPECT_EQ(count_params(gpt_param_specs(preset("mixtral-8x7b"))), 46702792704);
  const GptConfig c = small_moe(true, 0, 2);
  EXPECT_FALSE(c.moe.is_moe_layer(0));
  EXPECT_TRUE(c.moe.is_moe_layer(1));
  int moe = 0, dense = 0;
  for (const auto& s : gpt_param_specs(c)) {
    moe += s.name.rfind("transformer.h.1.moe.", 0) == 0;
    dense += s.name.rfind("transformer.h.0.mlp.", 0) == 0;
  }
  EXPECT_EQ(moe, 3);    // router, experts' c_fc and c_proj
  EXPECT_EQ(dense, 2);  // c_fc and c_proj
}

}  // namespace
}  // namespace mt::model

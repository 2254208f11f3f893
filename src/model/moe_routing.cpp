#include "model/moe_routing.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace mt::model {

int64_t expert_capacity(double capacity_factor, int64_t n, int64_t k, int64_t e) {
  if (capacity_factor <= 0) return n * k;
  const double c = std::ceil(capacity_factor * static_cast<double>(n * k) / static_cast<double>(e));
  return std::min<int64_t>(n * k, static_cast<int64_t>(c));
}

void route(Routing& r, const float* logits, const RouteOptions& o) {
  const int64_t n = r.n, e = r.e, k = r.k;
  MT_ASSERT(k >= 1 && k <= e);
  for (int64_t t = 0; t < n; ++t) {
    const float* l = logits + t * e;
    float* p = r.probs + t * e;
    float mx = l[0];
    for (int64_t i = 1; i < e; ++i) mx = std::max(mx, l[i]);
    double sum = 0;
    for (int64_t i = 0; i < e; ++i) sum += std::exp(static_cast<double>(l[i] - mx));
    r.lse[t] = mx + static_cast<float>(std::log(sum));
    for (int64_t i = 0; i < e; ++i)
      p[i] = static_cast<float>(std::exp(static_cast<double>(l[i] - mx)) / sum);
    // Top k by selection score (the probability, plus the balancing bias), best first; a tie
    // goes to the lower expert index. k passes over e experts: k and e are small.
    int32_t* sel = r.expert + t * k;
    if (o.forced_expert) {
      for (int64_t j = 0; j < k; ++j) {
        const int32_t f = o.forced_expert[t * k + j];
        if (f < 0 || f >= e)
          fail("routing replay: expert {} of token {} is not one of {}", f, t, e);
        sel[j] = f;
      }
    }
    for (int64_t j = 0; j < k && !o.forced_expert; ++j) {
      int32_t best = -1;
      float best_score = 0;
      for (int64_t i = 0; i < e; ++i) {
        bool taken = false;
        for (int64_t m = 0; m < j; ++m) taken |= sel[m] == i;
        if (taken) continue;
        const float s = p[i] + (o.selection_bias ? o.selection_bias[i] : 0.f);
        if (best < 0 || s > best_score) {
          best = static_cast<int32_t>(i);
          best_score = s;
        }
      }
      sel[j] = best;
    }
    // Combine weights: the chosen probabilities renormalised (Mixtral), or a softmax over the
    // chosen logits: the same numbers (p_i / Σ p_sel = exp(l_i) / Σ exp(l_sel)), rounded apart.
    float* g = r.gate + t * k;
    if (o.order == RouterOrder::kSoftmaxTopK) {
      double s = 0;
      for (int64_t j = 0; j < k; ++j) s += p[sel[j]];
      for (int64_t j = 0; j < k; ++j) g[j] = static_cast<float>(p[sel[j]] / s);
    } else {
      float m = l[sel[0]];
      for (int64_t j = 1; j < k; ++j) m = std::max(m, l[sel[j]]);
      double s = 0;
      for (int64_t j = 0; j < k; ++j) s += std::exp(static_cast<double>(l[sel[j]] - m));
      for (int64_t j = 0; j < k; ++j)
        g[j] = static_cast<float>(std::exp(static_cast<double>(l[sel[j]] - m)) / s);
    }
  }
  // Capacity: per expert, its assignments by descending router probability (ties: the
  // earlier token); those past the capacity are dropped (slot -1).
  std::vector<int64_t>& counts = *r.counts;
  std::vector<int64_t>& routed = *r.routed;
  counts.assign(static_cast<size_t>(e), 0);
  routed.assign(static_cast<size_t>(e), 0);
  for (int64_t a = 0; a < n * k; ++a) ++routed[static_cast<size_t>(r.expert[a])];
  const int64_t cap = expert_capacity(o.capacity_factor, n, k, e);
  for (int64_t a = 0; a < n * k; ++a)  // 0: kept, -1: dropped (for now)
    r.slot[a] = o.forced_dropped && o.forced_dropped[a] ? -1 : 0;
  bool any_over = false;
  for (int64_t i = 0; i < e && !o.forced_dropped; ++i)
    any_over |= routed[static_cast<size_t>(i)] > cap;
  if (any_over) {
    // Per thread, grown once: the steady-state step allocates nothing here.
    thread_local std::vector<int32_t> mine;
    for (int64_t i = 0; i < e; ++i) {
      if (routed[static_cast<size_t>(i)] <= cap) continue;
      mine.clear();
      for (int64_t a = 0; a < n * k; ++a)
        if (r.expert[a] == i) mine.push_back(static_cast<int32_t>(a));
      std::stable_sort(mine.begin(), mine.end(), [&](int32_t x, int32_t y) {
        return r.probs[x / k * e + i] > r.probs[y / k * e + i];  // stable: earlier token first
      });
      for (size_t m = static_cast<size_t>(cap); m < mine.size(); ++m) r.slot[mine[m]] = -1;
    }
  }
  // The expert-sorted order: expert by expert, tokens ascending.
  thread_local std::vector<int64_t> next;
  next.assign(static_cast<size_t>(e) + 1, 0);
  for (int64_t a = 0; a < n * k; ++a)
    if (r.slot[a] >= 0) ++counts[static_cast<size_t>(r.expert[a])];
  for (int64_t i = 0; i < e; ++i)
    next[static_cast<size_t>(i) + 1] =
        next[static_cast<size_t>(i)] + counts[static_cast<size_t>(i)];
  r.kept = next[static_cast<size_t>(e)];
  for (int64_t a = 0; a < n * k; ++a) {
    if (r.slot[a] < 0) continue;
    const int64_t row = next[static_cast<size_t>(r.expert[a])]++;
    r.slot[a] = static_cast<int32_t>(row);
    r.order[row] = static_cast<int32_t>(a);
  }
}

void capacity_drops(uint8_t* dropped, const int32_t* expert, const float* prob, int64_t n,
                    int64_t k, int64_t e, double capacity_factor) {
  const int64_t cap = expert_capacity(capacity_factor, n, k, e);
  std::fill(dropped, dropped + n * k, uint8_t{0});
  thread_local std::vector<int32_t> mine;  // grown once
  for (int64_t i = 0; i < e; ++i) {
    mine.clear();
    for (int64_t a = 0; a < n * k; ++a)
      if (expert[a] == i) mine.push_back(static_cast<int32_t>(a));
    if (static_cast<int64_t>(mine.size()) <= cap) continue;
    std::stable_sort(mine.begin(), mine.end(),
                     [&](int32_t x, int32_t y) { return prob[x] > prob[y]; });
    for (size_t m = static_cast<size_t>(cap); m < mine.size(); ++m) dropped[mine[m]] = 1;
  }
}

BalanceSums balance_sums(const Routing& r) {
  const int64_t n = r.n, e = r.e;
  BalanceSums s;
  s.n = n;
  s.routed.assign(static_cast<size_t>(e), 0.0);
  s.psum.assign(static_cast<size_t>(e), 0.0);
  for (int64_t i = 0; i < e; ++i) {
    s.routed[static_cast<size_t>(i)] = static_cast<double>((*r.routed)[static_cast<size_t>(i)]);
    double P = 0;
    for (int64_t t = 0; t < n; ++t) P += r.probs[t * e + i];
    s.psum[static_cast<size_t>(i)] = P;
  }
  for (int64_t t = 0; t < n; ++t) s.zsum += static_cast<double>(r.lse[t]) * r.lse[t];
  return s;
}

BalanceLosses balance_losses(const BalanceSums& s, int64_t k) {
  BalanceLosses b;
  const int64_t n = s.n, e = static_cast<int64_t>(s.routed.size());
  if (n == 0) return b;
  for (int64_t i = 0; i < e; ++i) {
    const double f = s.routed[static_cast<size_t>(i)] / static_cast<double>(n * k);
    b.aux += f * s.psum[static_cast<size_t>(i)] / static_cast<double>(n);
  }
  b.aux *= static_cast<double>(e);
  b.z = s.zsum / static_cast<double>(n);
  return b;
}

// balance_losses(balance_sums(r), r.k) in the same order of additions, without the sums'
// vectors (this runs per MoE layer per microbatch).
BalanceLosses balance_losses(const Routing& r) {
  BalanceLosses b;
  const int64_t n = r.n, e = r.e, k = r.k;
  if (n == 0) return b;
  for (int64_t i = 0; i < e; ++i) {
    double P = 0;
    for (int64_t t = 0; t < n; ++t) P += r.probs[t * e + i];
    const double f =
        static_cast<double>((*r.routed)[static_cast<size_t>(i)]) / static_cast<double>(n * k);
    b.aux += f * P / static_cast<double>(n);
  }
  b.aux *= static_cast<double>(e);
  double zsum = 0;
  for (int64_t t = 0; t < n; ++t) zsum += static_cast<double>(r.lse[t]) * r.lse[t];
  b.z = zsum / static_cast<double>(n);
  return b;
}

void route_backward(float* dlogits, const float* dgate, const Routing& r, double aux_coef,
                    double z_coef, const BalanceSums* whole) {
  const int64_t n = r.n, e = r.e, k = r.k;
  // The losses' token count and loads: the whole microbatch's (cp), or this routing's.
  const int64_t N = whole ? whole->n : n;
  auto routed = [&](int64_t i) {
    return whole ? whole->routed[static_cast<size_t>(i)]
                 : static_cast<double>((*r.routed)[static_cast<size_t>(i)]);
  };
  // d(aux)/d(p_ti) = E · f_i / N: the same for every token.
  thread_local std::vector<double> daux, dp, dsel;  // per thread, grown once
  daux.assign(static_cast<size_t>(e), 0.0);
  if (aux_coef != 0 && N > 0)
    for (int64_t i = 0; i < e; ++i)
      daux[static_cast<size_t>(i)] = aux_coef * static_cast<double>(e) * routed(i) /
                                     static_cast<double>(N * k) / static_cast<double>(N);
  dp.resize(static_cast<size_t>(e));
  dsel.resize(static_cast<size_t>(k));
  for (int64_t t = 0; t < n; ++t) {
    const float* p = r.probs + t * e;
    const float* g = r.gate + t * k;
    const float* dg = dgate + t * k;
    const int32_t* sel = r.expert + t * k;
    float* dl = dlogits + t * e;
    // Gates: a softmax over the chosen logits, d l_j = g_j (dg_j − Σ_m g_m dg_m).
    double gdg = 0;
    for (int64_t j = 0; j < k; ++j) gdg += static_cast<double>(g[j]) * dg[j];
    for (int64_t i = 0; i < e; ++i) dl[i] = 0.f;
    for (int64_t j = 0; j < k; ++j) dsel[static_cast<size_t>(j)] = g[j] * (dg[j] - gdg);
    // The probabilities' share (aux) through the full softmax: d l = p ⊙ (dp − Σ p·dp).
    double pdp = 0;
    for (int64_t i = 0; i < e; ++i) {
      dp[static_cast<size_t>(i)] = daux[static_cast<size_t>(i)];
      pdp += p[i] * dp[static_cast<size_t>(i)];
    }
    // z-loss: d(z_coef · lse² / N)/d l_i = 2 z_coef lse p_i / N.
    const double zt = N > 0 ? 2.0 * z_coef * r.lse[t] / static_cast<double>(N) : 0.0;
    for (int64_t i = 0; i < e; ++i)
      dl[i] = static_cast<float>(p[i] * (dp[static_cast<size_t>(i)] - pdp) + zt * p[i]);
    for (int64_t j = 0; j < k; ++j) dl[sel[j]] += static_cast<float>(dsel[static_cast<size_t>(j)]);
  }
}

}  // namespace mt::model

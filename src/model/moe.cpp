#include "model/moe.h"

#include <cstring>

#include "core/error.h"
#include "core/profile.h"
#include "kernels/kernels.h"
#include "model/layers.h"

namespace mt::model {

namespace {
Tensor acts(const Shape& s, DType t = DType::kF32) {
  return Tensor::empty(s, t, mem::Category::kActivations);
}
Tensor scratch(const Shape& s) { return Tensor::empty(s, DType::kF32, mem::Category::kWorkspace); }
const float* value_of(const Param* p) { return p ? p->value.f32() : nullptr; }
float* grad_of(const Param* p) { return p ? p->grad.f32() : nullptr; }

void activation_forward(MlpKind mlp, float* act, const float* h, int64_t rows, int64_t f) {
  if (mlp == MlpKind::kSwiGlu)
    kernels::swiglu_forward(act, h, rows, f);
  else
    kernels::gelu_forward(act, h, rows * f);
}
void activation_backward(MlpKind mlp, float* dh, const float* h, const float* dact, int64_t rows,
                         int64_t f) {
  if (mlp == MlpKind::kSwiGlu)
    kernels::swiglu_backward(dh, h, dact, rows, f);
  else
    kernels::gelu_backward(dh, h, dact, rows * f);
}
}  // namespace

namespace {
// Rows of the expert buffers: every kept assignment of this rank's n tokens, or with ep
// what its experts can receive (parallel/expert.h).
int64_t expert_rows(const GptConfig& c, int64_t n, int ep) {
  const int64_t k = c.moe.top_k;
  return ep > 1 ? parallel::ep::max_received_rows(ep, n, k, c.moe.n_experts, 0) : n * k;
}
}  // namespace

MoeActivations MoeLayer::make_activations(const GptConfig& c, int64_t n, int ep) {
  const int64_t E = c.moe.n_experts, k = c.moe.top_k, C = c.d_model, F = c.expert_ff();
  const int64_t FC = c.mlp == MlpKind::kSwiGlu ? 2 * F : F, R = expert_rows(c, n, ep);
  MoeActivations a;
  a.probs = acts({n, E});
  a.lse = acts({n});
  a.gate = acts({n, k});
  a.expert = acts({n, k}, DType::kI32);
  a.slot = acts({n, k}, DType::kI32);
  a.order = acts({n * k}, DType::kI32);
  a.h = acts({R, FC});
  a.act = acts({R, F});
  a.ys = acts({n * k, C});
  if (ep > 1) a.xe = acts({R, C});
  if (c.moe.d_ff_shared > 0) {
    const int64_t Fs = c.moe.d_ff_shared, FCs = c.mlp == MlpKind::kSwiGlu ? 2 * Fs : Fs;
    a.shared_h = acts({n, FCs});
    a.shared_act = acts({n, Fs});
  }
  a.counts.assign(static_cast<size_t>(E), 0);
  a.routed.assign(static_cast<size_t>(E), 0);
  return a;
}

MoeScratch MoeLayer::make_scratch(const GptConfig& c, int64_t n, int ep) {
  const int64_t E = c.moe.n_experts, k = c.moe.top_k, C = c.d_model, F = c.expert_ff();
  const int64_t FC = c.mlp == MlpKind::kSwiGlu ? 2 * F : F, R = expert_rows(c, n, ep);
  MoeScratch s;
  s.logits = scratch({n, E});
  s.xs = scratch({n * k, C});
  s.dys = scratch({n * k, C});
  s.dact = scratch({R, F});
  s.dh = scratch({R, FC});
  s.dgate = scratch({n, k});
  s.y = scratch({n, C});
  if (ep > 1) {
    s.xr = scratch({R, C});
    s.ye = scratch({R, C});
  }
  if (c.moe.d_ff_shared > 0) {
    const int64_t Fs = c.moe.d_ff_shared, FCs = c.mlp == MlpKind::kSwiGlu ? 2 * Fs : Fs;
    s.dshared_act = scratch({n, Fs});
    s.dshared_h = scratch({n, FCs});
  }
  return s;
}

Routing MoeLayer::routing(const MoeActivations& a, int64_t n) const {
  MoeActivations& m = const_cast<MoeActivations&>(a);  // the views are the caller's buffers
  Routing r;
  r.n = n;
  r.e = experts;
  r.k = top_k;
  r.probs = m.probs.f32();
  r.lse = m.lse.f32();
  r.expert = m.expert.data<int32_t>();
  r.gate = m.gate.f32();
  r.slot = m.slot.data<int32_t>();
  r.order = m.order.data<int32_t>();
  r.counts = &m.counts;
  r.routed = &m.routed;
  r.kept = m.kept;
  return r;
}

void MoeLayer::mlp_forward(float* h, float* act, float* y, const float* x, int64_t rows,
                           const float* w1, const bf16* w1b, const float* b1, const float* w2,
                           const bf16* w2b, const float* b2, int64_t width) const {
  const int64_t wide = mlp == MlpKind::kSwiGlu ? 2 * width : width;
  gemm_forward(mp, h, x, w1, w1b, b1, rows, c, wide);
  activation_forward(mlp, act, h, rows, width);
  gemm_forward(mp, y, act, w2, w2b, b2, rows, width, c);
}

void MoeLayer::experts_forward(const std::vector<int64_t>& rows_of, const float* x, float* h,
                               float* act, float* y) const {
  const int64_t C = c, FC = fc();
  int64_t row0 = 0;
  for (size_t e = 0; e < rows_of.size(); ++e) {
    const int64_t rows = rows_of[e];
    if (rows > 0) {
      const int64_t le = static_cast<int64_t>(e), w1 = le * FC * C, w2 = le * C * f;
      mlp_forward(
          h + row0 * FC, act + row0 * f, y + row0 * C, x + row0 * C, rows,
          mp ? nullptr : w_in->value.f32() + w1, mp ? w_in->value_bf16.bf16p() + w1 : nullptr,
          b_in ? b_in->value.f32() + le * FC : nullptr, mp ? nullptr : w_out->value.f32() + w2,
          mp ? w_out->value_bf16.bf16p() + w2 : nullptr,
          b_out ? b_out->value.f32() + le * C : nullptr, f);
    }
    row0 += rows;
  }
}

void MoeLayer::mlp_backward(float* dy_dx, const float* x, const float* h, const float* act,
                            int64_t rows, const float* w1, const bf16* w1b, float* dw1, float* db1,
                            const float* w2, const bf16* w2b, float* dw2, float* db2,
                            MoeScratch& s) const {
  const int64_t C = c, FC = fc();
  gemm_backward(mp, s.dact.f32(), dw2, db2, dy_dx, act, w2, w2b, rows, f, C);
  activation_backward(mlp, s.dh.f32(), h, s.dact.f32(), rows, f);
  gemm_backward(mp, nullptr, dw1, db1, s.dh.f32(), x, nullptr, w1b, rows, C, FC);
  // The rows of d(y) were read above: d(x) takes their place.
  gemm_backward(mp, dy_dx, nullptr, nullptr, s.dh.f32(), nullptr, w1, w1b, rows, C, FC);
}

void MoeLayer::experts_backward(const std::vector<int64_t>& rows_of, float* dy_dx, const float* x,
                                const float* h, const float* act, MoeScratch& s) const {
  const int64_t C = c, FC = fc();
  int64_t row0 = 0;
  for (size_t e = 0; e < rows_of.size(); ++e) {
    const int64_t rows = rows_of[e];
    if (rows > 0) {
      const int64_t le = static_cast<int64_t>(e), w1 = le * FC * C, w2 = le * C * f;
      mlp_backward(
          dy_dx + row0 * C, x + row0 * C, h + row0 * FC, act + row0 * f, rows,
          mp ? nullptr : w_in->value.f32() + w1, mp ? w_in->value_bf16.bf16p() + w1 : nullptr,
          w_in->grad.f32() + w1, b_in ? b_in->grad.f32() + le * FC : nullptr,
          mp ? nullptr : w_out->value.f32() + w2, mp ? w_out->value_bf16.bf16p() + w2 : nullptr,
          w_out->grad.f32() + w2, b_out ? b_out->grad.f32() + le * C : nullptr, s);
    }
    row0 += rows;
  }
}

namespace {
// --moe-shadow: the rows of the experts that still travel (not shadowed), each expert's
// block of the expert-sorted rows, packed one after another (pack) or put back (unpack).
void travelling_rows(const std::vector<int64_t>& counts, const std::vector<uint8_t>& shadowed,
                     float* sorted, float* packed, int64_t width, bool pack) {
  int64_t at = 0, to = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    const size_t bytes = static_cast<size_t>(counts[e] * width) * sizeof(float);
    if (!shadowed[e] && bytes > 0) {
      if (pack)
        std::memcpy(packed + to * width, sorted + at * width, bytes);
      else
        std::memcpy(sorted + at * width, packed + to * width, bytes);
      to += counts[e];
    }
    at += counts[e];
  }
}

// Elements each ep rank holds of the shadowed experts (`per` each): owner r's experts
// [r·El, (r+1)·El).
std::vector<int64_t> shadow_counts(const std::vector<uint8_t>& shadowed, int ranks, int64_t per) {
  const int64_t El = static_cast<int64_t>(shadowed.size()) / ranks;
  std::vector<int64_t> n(static_cast<size_t>(ranks), 0);
  for (size_t e = 0; e < shadowed.size(); ++e)
    if (shadowed[e]) n[e / static_cast<size_t>(El)] += per;
  return n;
}

void allocate_once(Tensor& t, const Shape& shape, DType dtype, mem::Category c) {
  if (!t.defined()) t = Tensor::empty(shape, dtype, c);
}
}  // namespace

void MoeLayer::make_shadow_activations(MoeActivations& a) const {
  const int64_t El = local_experts(), FC = fc(), Wm = shadow_matrix_elems(),
                Wb = shadow_bias_elems(), rows_max = a.ys.shape()[0];
  allocate_once(a.shadow_w, {El, Wm}, mp ? DType::kBF16 : DType::kF32, mem::Category::kActivations);
  if (Wb > 0) allocate_once(a.shadow_b, {El, Wb}, DType::kF32, mem::Category::kActivations);
  // The shadowed rows' h and act go after the received rows' in h and act when top_k <=
  // E/ep: a source then sends a rank at most n·k rows, so the received rows and this rank's
  // own shadowed ones number at most ep·n·k, what h holds. Else in buffers of their own.
  if (top_k > El) {
    allocate_once(a.shadow_h, {rows_max, FC}, DType::kF32, mem::Category::kActivations);
    allocate_once(a.shadow_act, {rows_max, f}, DType::kF32, mem::Category::kActivations);
  }
}

void MoeLayer::shadow_buffers(MoeActivations& a, MoeScratch& s) const {
  // The scratch at the first forward with --moe-shadow, shadows or not (every forward of
  // the first step shares it); the activations' made with them, else here.
  const int64_t El = local_experts(), Wm = shadow_matrix_elems(), Wb = shadow_bias_elems();
  const DType wt = mp ? DType::kBF16 : DType::kF32;
  make_shadow_activations(a);
  allocate_once(s.shadow_pack, {El, Wm}, wt, mem::Category::kWorkspace);
  if (Wb > 0) allocate_once(s.shadow_pack_b, {El, Wb}, DType::kF32, mem::Category::kWorkspace);
  allocate_once(s.shadow_dw, {El, Wm + Wb}, DType::kF32, mem::Category::kWorkspace);
  allocate_once(s.shadow_sum, {El, Wm + Wb}, DType::kF32, mem::Category::kWorkspace);
}

void MoeLayer::shadow_forward(MoeActivations& a, const float* xs, MoeScratch& s) const {
  const int64_t El = local_experts(), C = c, FC = fc(), Wm = shadow_matrix_elems(),
                Wb = shadow_bias_elems();
  const DType wt = mp ? DType::kBF16 : DType::kF32;
  a.shadow_row0 = top_k <= El ? a.exchange.received : -1;
  float* sh_h = a.shadow_row0 >= 0 ? a.h.f32() + a.shadow_row0 * FC : a.shadow_h.f32();
  float* sh_act = a.shadow_row0 >= 0 ? a.act.f32() + a.shadow_row0 * f : a.shadow_act.f32();
  // This rank's own shadowed experts, packed: [w_in | w_out] each (and [b_in | b_out]).
  const size_t wbytes = static_cast<size_t>(dtype_bytes(wt));
  int64_t mine = 0;
  for (int64_t le = 0; le < El; ++le) {
    if (!a.shadowed[static_cast<size_t>(ep.rank * El + le)]) continue;
    char* to = static_cast<char*>(s.shadow_pack.raw()) + static_cast<size_t>(mine * Wm) * wbytes;
    const char* w1 = mp ? reinterpret_cast<const char*>(w_in->value_bf16.bf16p())
                        : reinterpret_cast<const char*>(w_in->value.f32());
    const char* w2 = mp ? reinterpret_cast<const char*>(w_out->value_bf16.bf16p())
                        : reinterpret_cast<const char*>(w_out->value.f32());
    std::memcpy(to, w1 + static_cast<size_t>(le * FC * C) * wbytes,
                static_cast<size_t>(FC * C) * wbytes);
    std::memcpy(to + static_cast<size_t>(FC * C) * wbytes,
                w2 + static_cast<size_t>(le * C * f) * wbytes, static_cast<size_t>(C * f) * wbytes);
    if (Wb > 0) {
      float* b = s.shadow_pack_b.f32() + mine * Wb;
      if (b_in)
        std::memcpy(b, b_in->value.f32() + le * FC, static_cast<size_t>(FC) * sizeof(float));
      if (b_out)
        std::memcpy(b + (b_in ? FC : 0), b_out->value.f32() + le * C,
                    static_cast<size_t>(C) * sizeof(float));
    }
    ++mine;
  }
  ep.group->all_gather(comm::Buf(s.shadow_pack.raw(), mine * Wm, wt),
                       comm::Buf(a.shadow_w.raw(), a.shadows * Wm, wt),
                       shadow_counts(a.shadowed, ep.size, Wm));
  if (Wb > 0)
    ep.group->all_gather(comm::Buf(s.shadow_pack_b.f32(), mine * Wb),
                         comm::Buf(a.shadow_b.f32(), a.shadows * Wb),
                         shadow_counts(a.shadowed, ep.size, Wb));
  // This rank's rows of each shadowed expert, in place in the expert-sorted order.
  int64_t at = 0, kept = 0, slot = 0;
  for (size_t e = 0; e < a.counts.size(); ++e) {
    const int64_t rows = a.counts[e];
    if (a.shadowed[e]) {
      const char* w =
          static_cast<const char*>(a.shadow_w.raw()) + static_cast<size_t>(slot * Wm) * wbytes;
      const float* b = Wb > 0 ? a.shadow_b.f32() + slot * Wb : nullptr;
      if (rows > 0)
        mlp_forward(sh_h + kept * FC, sh_act + kept * f, a.ys.f32() + at * C, xs + at * C, rows,
                    mp ? nullptr : reinterpret_cast<const float*>(w),
                    mp ? reinterpret_cast<const bf16*>(w) : nullptr, b_in ? b : nullptr,
                    mp ? nullptr : reinterpret_cast<const float*>(w) + FC * C,
                    mp ? reinterpret_cast<const bf16*>(w) + FC * C : nullptr,
                    b_out ? b + (b_in ? FC : 0) : nullptr, f);
      kept += rows;
      ++slot;
    }
    at += rows;
  }
}

void MoeLayer::shadow_backward(const MoeActivations& a, float* dys, const float* x,
                               const Routing& r, MoeScratch& s) const {
  const int64_t El = local_experts(), C = c, FC = fc(), Wm = shadow_matrix_elems(),
                Wb = shadow_bias_elems(), Wg = Wm + Wb, k = top_k;
  const DType wt = mp ? DType::kBF16 : DType::kF32;
  const size_t wbytes = static_cast<size_t>(dtype_bytes(wt));
  float* dw = s.shadow_dw.f32();
  const float* sh_h = a.shadow_row0 >= 0 ? a.h.f32() + a.shadow_row0 * FC : a.shadow_h.f32();
  const float* sh_act = a.shadow_row0 >= 0 ? a.act.f32() + a.shadow_row0 * f : a.shadow_act.f32();
  std::memset(dw, 0, static_cast<size_t>(a.shadows * Wg) * sizeof(float));
  float* xs = s.xs.f32();
  int64_t at = 0, kept = 0, slot = 0;
  for (size_t e = 0; e < a.counts.size(); ++e) {
    const int64_t rows = a.counts[e];
    if (a.shadowed[e]) {
      for (int64_t row = at; row < at + rows; ++row)  // the inputs, gathered again
        std::memcpy(xs + row * C, x + (r.order[row] / k) * C,
                    static_cast<size_t>(C) * sizeof(float));
      const char* w =
          static_cast<const char*>(a.shadow_w.raw()) + static_cast<size_t>(slot * Wm) * wbytes;
      float* g = dw + slot * Wg;
      if (rows > 0)
        mlp_backward(dys + at * C, xs + at * C, sh_h + kept * FC, sh_act + kept * f, rows,
                     mp ? nullptr : reinterpret_cast<const float*>(w),
                     mp ? reinterpret_cast<const bf16*>(w) : nullptr, g, b_in ? g + Wm : nullptr,
                     mp ? nullptr : reinterpret_cast<const float*>(w) + FC * C,
                     mp ? reinterpret_cast<const bf16*>(w) + FC * C : nullptr, g + FC * C,
                     b_out ? g + Wm + (b_in ? FC : 0) : nullptr, s);
      kept += rows;
      ++slot;
    }
    at += rows;
  }
  // Every rank's gradients of each shadowed expert, summed at its owner (in rank order).
  const std::vector<int64_t> counts = shadow_counts(a.shadowed, ep.size, Wg);
  const int64_t mine = counts[static_cast<size_t>(ep.rank)] / Wg;
  ep.group->reduce_scatter(comm::Buf(dw, a.shadows * Wg), comm::Buf(s.shadow_sum.f32(), mine * Wg),
                           counts);
  const float* sum = s.shadow_sum.f32();
  for (int64_t le = 0; le < El; ++le) {
    if (!a.shadowed[static_cast<size_t>(ep.rank * El + le)]) continue;
    kernels::add(w_in->grad.f32() + le * FC * C, w_in->grad.f32() + le * FC * C, sum, FC * C);
    kernels::add(w_out->grad.f32() + le * C * f, w_out->grad.f32() + le * C * f, sum + FC * C,
                 C * f);
    if (b_in) kernels::add(b_in->grad.f32() + le * FC, b_in->grad.f32() + le * FC, sum + Wm, FC);
    if (b_out)
      kernels::add(b_out->grad.f32() + le * C, b_out->grad.f32() + le * C,
                   sum + Wm + (b_in ? FC : 0), C);
    sum += Wg;
  }
}

void MoeLayer::cp_capacity(MoeActivations& a, const Routing& r, double capacity_factor,
                           int64_t n) const {
  const int64_t k = top_k, lt = a.replay.local_T;
  if (lt <= 0 || n % lt != 0)
    fail(
        "moe: the capacity with cp needs the rows per sequence of this rank (got {} for {} "
        "rows): set by the model before the forward",
        lt, n);
  const int64_t T = lt * cp->size, B = n / lt, nk = n * k, whole = B * T;
  // Each rank's choices as (expert, probability) per assignment, gathered over cp.
  // Per thread, grown once: the steady-state step allocates nothing here.
  thread_local std::vector<float> mine, all, prob;
  thread_local std::vector<int32_t> expert;
  thread_local std::vector<int64_t> where;
  thread_local std::vector<uint8_t> dropped;
  mine.resize(static_cast<size_t>(2 * nk));
  all.resize(static_cast<size_t>(2 * nk * cp->size));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t ex = r.expert[t * k + j];
      mine[static_cast<size_t>(2 * (t * k + j))] = static_cast<float>(ex);  // exact: ex < 2^24
      mine[static_cast<size_t>(2 * (t * k + j) + 1)] = r.probs[t * experts + ex];
    }
  cp->group->all_gather(comm::Buf(mine.data(), 2 * nk), comm::Buf(all.data(), 2 * nk * cp->size));
  // In the whole microbatch's order: row t of sequence b on rank q is row b·T + position.
  expert.resize(static_cast<size_t>(whole * k));
  prob.resize(static_cast<size_t>(whole * k));
  where.resize(static_cast<size_t>(nk));  // this rank's assignments' places
  for (int q = 0; q < cp->size; ++q)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < lt; ++t) {
        const int64_t row = b * T + cp->position(T, t, q);
        for (int64_t j = 0; j < k; ++j) {
          const size_t from = static_cast<size_t>(2 * (q * nk + (b * lt + t) * k + j));
          const size_t to = static_cast<size_t>(row * k + j);
          expert[to] = static_cast<int32_t>(all[from]);
          prob[to] = all[from + 1];
          if (q == cp->rank) where[static_cast<size_t>((b * lt + t) * k + j)] = row * k + j;
        }
      }
  dropped.resize(static_cast<size_t>(whole * k));
  capacity_drops(dropped.data(), expert.data(), prob.data(), whole, k, experts, capacity_factor);
  a.cp_expert.assign(r.expert, r.expert + nk);
  a.cp_dropped.resize(static_cast<size_t>(nk));
  for (int64_t x = 0; x < nk; ++x)
    a.cp_dropped[static_cast<size_t>(x)] =
        dropped[static_cast<size_t>(where[static_cast<size_t>(x)])];
}

void MoeLayer::forward(MoeActivations& a, float* y, const float* x, int64_t n,
                       MoeScratch& s) const {
  const int64_t C = c, k = top_k;
  Routing r = routing(a, n);
  {
    profile::Scope p("moe.router");
    kernels::linear_forward(s.logits.f32(), x, router->value.f32(), nullptr, n, C, experts);
    RouteOptions ro{order, options ? options->capacity_factor : 0.0, selection_bias};
    const RoutingReplay& rp = a.replay;
    if (rp.active() && !rp.record) {  // the recorded choices, this layer's own gates
      const RoutingTape::Entry& e = rp.tape->find(rp.sample, rp.layer, n * k);
      ro.forced_expert = e.expert.data();
      ro.forced_dropped = e.dropped.data();
    } else if (cp && cp->active() && ro.capacity_factor > 0) {
      // The capacity compares the probabilities of the whole microbatch: route the piece
      // dropless, decide the drops on every piece's choices, then route with them.
      RouteOptions free = ro;
      free.capacity_factor = 0;
      route(r, s.logits.f32(), free);
      cp_capacity(a, r, ro.capacity_factor, n);
      ro.forced_expert = a.cp_expert.data();
      ro.forced_dropped = a.cp_dropped.data();
    }
    route(r, s.logits.f32(), ro);
    if (rp.active() && rp.record) {
      if (cp && cp->active()) {
        // This rank's rows are its two chunks of every sequence: row t of sequence b is row
        // b·T + position(t) of the whole microbatch (the oracle's order).
        const int64_t lt = rp.local_T, T = lt * cp->size, B = n / lt;
        const std::vector<int32_t> pos = cp->positions(T);
        std::vector<int64_t> rows(static_cast<size_t>(n));
        for (int64_t b = 0; b < B; ++b)
          for (int64_t t = 0; t < lt; ++t)
            rows[static_cast<size_t>(b * lt + t)] = b * T + pos[static_cast<size_t>(t)];
        rp.tape->record_rows(rp.sample, rp.layer, r.expert, r.slot, k, rows, B * T);
      } else {
        rp.tape->record(rp.sample, rp.layer, r.expert, r.slot, n * k);
      }
    }
    a.kept = r.kept;
    if (cp && cp->active()) {  // the whole microbatch's loads: sums over the cp pieces
      a.whole = balance_sums(r);
      const size_t E = static_cast<size_t>(experts);
      std::vector<float> v(2 * E + 2);
      for (size_t i = 0; i < E; ++i) {
        v[i] = static_cast<float>(a.whole.routed[i]);  // whole numbers: exact
        v[E + i] = static_cast<float>(a.whole.psum[i]);
      }
      v[2 * E] = static_cast<float>(a.whole.zsum);
      v[2 * E + 1] = static_cast<float>(a.whole.n);
      cp->group->all_reduce(comm::Buf(v.data(), static_cast<int64_t>(v.size())));
      for (size_t i = 0; i < E; ++i) {
        a.whole.routed[i] = v[i];
        a.whole.psum[i] = v[E + i];
      }
      a.whole.zsum = v[2 * E];
      a.whole.n = static_cast<int64_t>(v[2 * E + 1]);
      a.losses = balance_losses(a.whole, k);
    } else {
      a.losses = balance_losses(r);
    }
  }
  float* xs = s.xs.f32();
  {
    profile::Scope p("moe.permute");
    for (int64_t row = 0; row < r.kept; ++row)
      std::memcpy(xs + row * C, x + (r.order[row] / k) * C, static_cast<size_t>(C) * sizeof(float));
  }
  if (!ep.active()) {
    profile::Scope p("moe.experts");
    experts_forward(a.counts, xs, a.h.f32(), a.act.f32(), a.ys.f32());
  } else {
    // Dispatch this rank's rows to their experts' ranks, run the local experts on what
    // arrived, and return the outputs (parallel/expert.h).
    // With --moe-shadow the shadowed experts' rows stay here (parallel/expert.h).
    parallel::ep::Exchange& xg = a.exchange;
    {
      profile::Scope p("moe.dispatch");
      a.shadows = 0;
      if (options && options->shadow) {
        shadow_buffers(a, s);
        xg = parallel::ep::plan_exchange_shadowed(ep, a.counts, experts, options->shadow_above,
                                                  a.shadowed);
        for (const uint8_t on : a.shadowed) a.shadows += on;
      } else {
        xg = parallel::ep::plan_exchange(ep, a.counts, experts);
      }
      const float* send = xs;
      if (a.shadows > 0) {  // the travelling rows packed (dys is free in forward)
        travelling_rows(a.counts, a.shadowed, xs, s.dys.f32(), C, true);
        send = s.dys.f32();
      }
      parallel::ep::exchange_rows(ep, xg, send, s.xr.f32(), C, false);
      parallel::ep::to_expert_major(xg, s.xr.f32(), a.xe.f32(), C);
    }
    if (a.shadows > 0) {
      profile::Scope p("moe.shadow");
      shadow_forward(a, xs, s);
    }
    {
      profile::Scope p("moe.experts");
      experts_forward(xg.expert_rows, a.xe.f32(), a.h.f32(), a.act.f32(), s.ye.f32());
    }
    profile::Scope p("moe.combine.exchange");
    parallel::ep::to_source_major(xg, s.ye.f32(), s.xr.f32(), C);
    if (a.shadows > 0) {
      parallel::ep::exchange_rows(ep, xg, s.xr.f32(), s.dys.f32(), C, true);
      travelling_rows(a.counts, a.shadowed, a.ys.f32(), s.dys.f32(), C, false);
    } else {
      parallel::ep::exchange_rows(ep, xg, s.xr.f32(), a.ys.f32(), C, true);
    }
  }
  {
    profile::Scope p("moe.combine");
    const float* ys = a.ys.f32();
    for (int64_t t = 0; t < n; ++t) {
      float* yt = y + t * C;
      for (int64_t i = 0; i < C; ++i) yt[i] = 0.f;
      for (int64_t j = 0; j < k; ++j) {
        const int32_t row = r.slot[t * k + j];
        if (row < 0) continue;  // dropped: the token keeps only the residual for it
        const float g = r.gate[t * k + j];
        const float* src = ys + static_cast<int64_t>(row) * C;
        for (int64_t i = 0; i < C; ++i) yt[i] += g * src[i];
      }
    }
  }
  if (shared_in) {
    profile::Scope p("moe.shared");
    mlp_forward(a.shared_h.f32(), a.shared_act.f32(), s.y.f32(), x, n,
                mp ? nullptr : shared_in->value.f32(), mp ? shared_in->value_bf16.bf16p() : nullptr,
                value_of(shared_in_b), mp ? nullptr : shared_out->value.f32(),
                mp ? shared_out->value_bf16.bf16p() : nullptr, value_of(shared_out_b), f_shared);
    kernels::add(y, y, s.y.f32(), n * C);
  }
}

void MoeLayer::backward(float* dx, const float* dy, const float* x, int64_t n,
                        const MoeActivations& a, MoeScratch& s, float loss_weight) const {
  const int64_t C = c, k = top_k;
  const Routing r = routing(a, n);
  float* dys = s.dys.f32();
  float* dgate = s.dgate.f32();
  {
    profile::Scope p("moe.combine.bwd");  // y_t = Σ_j g_tj · ys_row: both factors' gradients
    const float* ys = a.ys.f32();
    for (int64_t t = 0; t < n; ++t) {
      const float* dyt = dy + t * C;
      for (int64_t j = 0; j < k; ++j) {
        const int32_t row = r.slot[t * k + j];
        if (row < 0) {
          dgate[t * k + j] = 0.f;
          continue;
        }
        const float g = r.gate[t * k + j];
        const float* src = ys + static_cast<int64_t>(row) * C;
        float* d = dys + static_cast<int64_t>(row) * C;
        double dot = 0;
        for (int64_t i = 0; i < C; ++i) {
          d[i] = g * dyt[i];
          dot += static_cast<double>(dyt[i]) * src[i];
        }
        dgate[t * k + j] = static_cast<float>(dot);
      }
    }
  }
  // d(expert outputs) -> d(expert inputs), in place in dys (row for row); the weight
  // gradients added. Without ep the inputs are gathered again (not kept: n·k·C floats per
  // layer); with ep the received rows were kept (gathering them again is an all-to-all).
  if (!ep.active()) {
    float* xs = s.xs.f32();
    for (int64_t row = 0; row < r.kept; ++row)
      std::memcpy(xs + row * C, x + (r.order[row] / k) * C, static_cast<size_t>(C) * sizeof(float));
    profile::Scope p("moe.experts.bwd");
    experts_backward(a.counts, dys, xs, a.h.f32(), a.act.f32(), s);
  } else {
    const parallel::ep::Exchange& xg = a.exchange;
    const bool shadows = a.shadows > 0;
    {
      profile::Scope p("moe.combine.exchange.bwd");
      const float* send = dys;
      if (shadows) {  // the travelling rows packed (xs is free in backward with ep)
        travelling_rows(a.counts, a.shadowed, dys, s.xs.f32(), C, true);
        send = s.xs.f32();
      }
      parallel::ep::exchange_rows(ep, xg, send, s.xr.f32(), C, false);
      parallel::ep::to_expert_major(xg, s.xr.f32(), s.ye.f32(), C);
    }
    {
      profile::Scope p("moe.experts.bwd");
      experts_backward(xg.expert_rows, s.ye.f32(), a.xe.f32(), a.h.f32(), a.act.f32(), s);
    }
    {
      profile::Scope p("moe.dispatch.bwd");
      parallel::ep::to_source_major(xg, s.ye.f32(), s.xr.f32(), C);
      parallel::ep::exchange_rows(ep, xg, s.xr.f32(), shadows ? s.xs.f32() : dys, C, true);
      if (shadows) travelling_rows(a.counts, a.shadowed, dys, s.xs.f32(), C, false);
    }
    if (shadows) {
      profile::Scope p("moe.shadow.bwd");
      shadow_backward(a, dys, x, r, s);
    }
  }
  {
    profile::Scope p("moe.router.bwd");
    float* dlogits = s.logits.f32();
    const double w = loss_weight;
    route_backward(dlogits, dgate, r, options ? options->aux_loss * w : 0.0,
                   options ? options->z_loss * w : 0.0, cp && cp->active() ? &a.whole : nullptr);
    kernels::linear_backward(dx, router->grad.f32(), nullptr, dlogits, x, router->value.f32(), n, C,
                             experts);
  }
  {
    profile::Scope p("moe.permute.bwd");  // the experts' input gradients back to their tokens
    for (int64_t t = 0; t < n; ++t) {
      float* dxt = dx + t * C;
      for (int64_t j = 0; j < k; ++j) {
        const int32_t row = r.slot[t * k + j];
        if (row < 0) continue;
        const float* src = dys + static_cast<int64_t>(row) * C;
        for (int64_t i = 0; i < C; ++i) dxt[i] += src[i];
      }
    }
  }
  if (shared_in) {
    profile::Scope p("moe.shared.bwd");
    const int64_t FCs = fc_shared();
    gemm_backward(mp, s.dshared_act.f32(), grad_of(shared_out), grad_of(shared_out_b), dy,
                  a.shared_act.f32(), mp ? nullptr : shared_out->value.f32(),
                  mp ? shared_out->value_bf16.bf16p() : nullptr, n, f_shared, C);
    activation_backward(mlp, s.dshared_h.f32(), a.shared_h.f32(), s.dshared_act.f32(), n, f_shared);
    gemm_backward(mp, s.y.f32(), grad_of(shared_in), grad_of(shared_in_b), s.dshared_h.f32(), x,
                  mp ? nullptr : shared_in->value.f32(),
                  mp ? shared_in->value_bf16.bf16p() : nullptr, n, C, FCs);
    kernels::add(dx, dx, s.y.f32(), n * C);
  }
  if (stats) {
    for (int64_t e = 0; e < experts; ++e)
      stats->routed[static_cast<size_t>(e)] +=
          static_cast<double>(a.routed[static_cast<size_t>(e)]);
    stats->assignments += static_cast<double>(n * k);
    stats->dropped += static_cast<double>(n * k - a.kept);
    stats->aux += a.losses.aux;
    stats->z += a.losses.z;
    stats->microbatches += 1;
    stats->shadowed += static_cast<double>(a.shadows);
  }
}

}  // namespace mt::model

#include "train/replica.h"

#include <algorithm>

#include "core/error.h"
#include "core/profile.h"
#include "kernels/kernels.h"

namespace mt::train {

parallel::FlatLayout flat_layout(const model::Gpt& gpt) {
  parallel::FlatLayout l;
  for (const auto& p : gpt.params().params()) l.param_offsets.push_back(p.offset_elems);
  l.param_offsets.push_back(gpt.params().numel());
  l.unit_first_param = gpt.unit_first_params();
  l.padded_elems = gpt.params().padded_numel();
  return l;
}

namespace {
std::pair<int64_t, int64_t> range_of(const model::Param& p) {
  return {p.offset_elems, p.offset_elems + shape_numel(p.spec.shape)};
}

// ZeRO-3 with bf16, a unit whose GEMM weights are gathered in f32 (ShardedParams gathers
// the others' in bf16): after ShardedParams has gathered it (it runs first in the chain),
// its GEMM weights are rounded into the unit's bf16 slot. Such a bf16 slot is written only
// here, for a unit of the same f32 slot, so it holds a unit's copy exactly while the f32
// slot holds that unit's values. The head's backward reads wte, gathered with it (unit 0).
class Bf16Refresh : public parallel::UnitHooks {
 public:
  Bf16Refresh(model::ParamStore& ps, std::vector<int> first, const parallel::ShardedParams& sp)
      : ps_(ps), first_(std::move(first)), sp_(sp) {}
  void before_forward(int unit) override { refresh(unit); }
  void before_backward(int unit) override {
    refresh(unit);
    if (unit == static_cast<int>(first_.size()) - 2 && unit > 0) refresh(0);
  }

 private:
  void refresh(int unit) {
    if (sp_.gathers_bf16(unit)) return;  // gathered in bf16 already
    ps_.refresh_bf16(first_[static_cast<size_t>(unit)], first_[static_cast<size_t>(unit) + 1]);
  }
  model::ParamStore& ps_;
  std::vector<int> first_;
  const parallel::ShardedParams& sp_;
};

// ZeRO-3 with bf16: the flat ranges of unit u gathered in bf16 — its GEMM weights, when no
// f32 reader needs any of them (the embedding table, tied to the LM head, is read in f32 by
// the embedding: that unit's weights are gathered in f32 and rounded after). Adjacent
// ranges merge.
std::vector<parallel::ShardedParams::Ranges> bf16_gather_ranges(const model::Gpt& gpt,
                                                                const std::vector<int>& first) {
  const model::ParamStore& ps = gpt.params();
  std::vector<parallel::ShardedParams::Ranges> out(first.size() - 1);
  for (size_t u = 0; u + 1 < first.size(); ++u) {
    parallel::ShardedParams::Ranges& r = out[u];
    for (int i = first[u]; i < first[u + 1]; ++i) {
      const model::Param& p = ps.params()[static_cast<size_t>(i)];
      if (p.bf16_offset_elems < 0) continue;
      if (gpt.parts().embedding && &p == gpt.wte()) {
        r.clear();
        break;
      }
      const auto [a, b] = range_of(p);
      if (!r.empty() && r.back().second == a)
        r.back().second = b;
      else
        r.emplace_back(a, b);
    }
  }
  return out;
}
}  // namespace

Replica::Replica(const model::GptConfig& config, uint64_t seed, const AdamWConfig& adamw,
                 const ReplicaOptions& ro, comm::Group& dp_group, parallel::tp::TpContext tp_ctx,
                 model::StageParts parts, parallel::ep::EpContext ep_ctx,
                 comm::Group* ep_grads_group)
    : dp(dp_group),
      options(ro),
      zero(ro.zero),
      gpt(config, seed,
          model::StoreOptions{dp_group.size(), ro.zero < 3, ro.zero < 2 || ro.pipelined, ro.bf16,
                              ro.zero < 3},
          tp_ctx, std::move(parts), ep_ctx),
      layout(flat_layout(gpt)),
      shard(dp_group.rank(), dp_group.size(), layout.padded_elems) {
  model::ParamStore& ps = gpt.params();
  const auto& first = layout.unit_first_param;
  if (zero >= 2 && !ro.pipelined) {
    grads = std::make_unique<parallel::ShardedGrads>(dp, layout);
    for (int u = 0; u < layout.num_units(); ++u)
      ps.bind_grads(first[u], first[u + 1], grads->unit_grads(u));
  }
  if (zero == 3) {
    values = std::make_unique<parallel::ShardedParams>(dp, layout);
    for (int u = 0; u < layout.num_units(); ++u)
      ps.bind_values(first[u], first[u + 1], values->unit_values(u));
    // Layout independence: the shard draws its own elements of the global init.
    ps.initialize_range(seed, shard.lo(), shard.shard_elems, values->shard_values().f32());
    std::vector<parallel::UnitHooks*> hooks{values.get()};
    if (ro.bf16) {
      const int U = layout.num_units();
      bf16_slots.resize(4);
      std::vector<int64_t> elems(4, 0);
      for (int u = 0; u < U; ++u) {
        int64_t& e = elems[static_cast<size_t>(parallel::UnitBuffers::slot_of(u, U))];
        e = std::max(e, ps.bf16_elems(first[u], first[u + 1]));
      }
      for (size_t k = 0; k < elems.size(); ++k)
        if (elems[k] > 0)
          bf16_slots[k] = Tensor::zeros({elems[k]}, DType::kBF16, mem::Category::kParameters);
      for (int u = 0; u < U; ++u)
        if (ps.bf16_elems(first[u], first[u + 1]) > 0)
          ps.bind_bf16(first[u], first[u + 1],
                       bf16_slots[static_cast<size_t>(parallel::UnitBuffers::slot_of(u, U))]);
      values->gather_in_bf16(bf16_gather_ranges(gpt, first), bf16_slots);
      bf16_refresh = std::make_unique<Bf16Refresh>(ps, first, *values);
      hooks.push_back(bf16_refresh.get());
    }
    if (grads) hooks.push_back(grads.get());
    if (hooks.size() > 1) {
      chain = std::make_unique<parallel::HookChain>(hooks);
      gpt.set_hooks(chain.get());
    } else {
      gpt.set_hooks(values.get());
    }
  } else if (grads) {
    gpt.set_hooks(grads.get());
  }
  if (!grads && (dp.size() > 1 || zero >= 1)) {
    const int64_t bucket_elems =
        std::max<int64_t>(1, static_cast<int64_t>(ro.bucket_mb * (1 << 20)) / 4);
    buckets = std::make_unique<parallel::BucketReducer>(
        dp, layout, ps.flat_grads(),
        zero == 0 ? parallel::BucketReducer::Mode::kAllReduce
                  : parallel::BucketReducer::Mode::kReduceScatter,
        bucket_elems);
    // Pipelined: the buckets are reduced at the step's end only (end_backward).
    if (!ro.pipelined && zero < 3) gpt.set_hooks(buckets.get());
  }
  // Stage 0 updates every element; the others only the shard.
  opt_lo = zero == 0 ? 0 : shard.lo();
  opt_hi = zero == 0 ? ps.numel() : shard.hi();
  opt = std::make_unique<AdamW>(ps, adamw, opt_lo, opt_hi);
  if (ro.bf16 && zero == 0) {  // every element updated here: the copy in the same pass
    opt->write_bf16_copies();
    bf16_in_optimizer = true;
  }

  const parallel::tp::TpContext& tp = gpt.tp();
  for (const auto& p : ps.params()) {
    const bool replicated_elsewhere =
        tp.active() && tp.rank != 0 && p.spec.tp_split == model::TpSplit::kReplicated;
    const bool tied_copy = ro.skip_tied_copy_in_norm && gpt.wte() == &p;
    const bool dense_elsewhere = ep_ctx.active() && ep_ctx.rank != 0 && !p.spec.expert;
    if (replicated_elsewhere || tied_copy || dense_elsewhere) uncounted.push_back(range_of(p));
  }
  std::sort(uncounted.begin(), uncounted.end());
  if (tp_ctx.sp) {  // layer norms, wpe: their gradients are sums over one sequence shard
    std::vector<std::pair<int64_t, int64_t>> partial;
    for (int i : gpt.sequence_parallel_params())
      partial.push_back(range_of(ps.params()[static_cast<size_t>(i)]));
    tp_sync = std::make_unique<parallel::tp::ReplicatedGradSync>(partial, opt_lo, opt_hi);
  }
  if (ep_ctx.active()) {
    if (!ep_grads_group) fail("expert parallelism needs the group of the dense gradients");
    ep_grads = ep_grads_group;
    std::vector<std::pair<int64_t, int64_t>> dense;
    for (const auto& p : ps.params()) {
      if (p.spec.expert) continue;
      const auto r = range_of(p);
      if (!dense.empty() && dense.back().second == r.first)
        dense.back().second = r.second;  // neighbours merge: fewer, longer copies
      else
        dense.push_back(r);
    }
    ep_sync = std::make_unique<parallel::tp::ReplicatedGradSync>(dense, opt_lo, opt_hi);
  }
}

double Replica::owned_norm_sq() {
  profile::Scope prof("grad_norm");
  const float* g = owned_grads();
  const int64_t lo = shard.lo(), hi = shard.hi();
  if (uncounted.empty()) return kernels::sum_squares(g, hi - lo);
  double sum = 0;
  int64_t e = lo;
  for (const auto& [a, b] : uncounted) {
    const int64_t stop = std::clamp(a, e, hi);
    if (stop > e) sum += kernels::sum_squares(g + (e - lo), stop - e);
    e = std::max(e, std::min(b, hi));
  }
  if (hi > e) sum += kernels::sum_squares(g + (e - lo), hi - e);
  return sum;
}

void Replica::begin_step() {
  profile::Scope prof("zero_grads");  // the step's gradients, before its first backward
  if (grads)
    grads->zero_shard();
  else
    gpt.params().zero_grads();
}

void Replica::begin_microbatch(bool last) {
  if (buckets) buckets->set_enabled(last);  // DDP / ZeRO-1 reduce once per step
}

void Replica::end_backward() {
  if (buckets) buckets->finish();
  if (grads) grads->finish();
  if (tp_sync) tp_sync->sync(gpt.tp(), opt_grads());   // --sp: sum the partial sums over tp
  if (ep_sync) ep_sync->sync(*ep_grads, opt_grads());  // --ep: dense gradients over the ep ranks
  if (values) values->drop_prefetches();               // the values change next
}

float* Replica::owned_grads() {
  if (grads) return grads->shard_grads().f32();
  return gpt.params().flat_grads().f32() + shard.lo();
}

float* Replica::opt_grads() {
  if (grads) return grads->shard_grads().f32();
  return gpt.params().flat_grads().f32() + opt_lo;
}

float* Replica::opt_values() {
  if (values) return values->shard_values().f32();
  return gpt.params().flat_values().f32() + opt_lo;
}

void Replica::optimizer_step(float lr, float grad_scale) {
  opt->step(lr, opt_values(), opt_grads(), grad_scale);
  if (zero == 1 || zero == 2) {  // every rank needs every updated value again
    Tensor& v = gpt.params().flat_values();
    dp.all_gather(comm::device_buf(v.f32() + shard.lo(), shard.shard_elems), comm::Buf(v));
  }
  // The working copy from the new master weights (stage 0: written by the update itself;
  // ZeRO-3: at each unit's next gather).
  if (options.bf16 && !values && !bf16_in_optimizer) gpt.params().refresh_bf16();
}

int64_t Replica::bf16_param_elems() const {
  if (!options.bf16) return 0;
  if (values) {
    int64_t n = 0;
    for (const Tensor& t : bf16_slots) n += t.defined() ? t.numel() : 0;
    return n;
  }
  const model::ParamStore& ps = gpt.params();
  return ps.bf16_elems(0, static_cast<int>(ps.params().size()));
}

void Replica::materialize_full() {
  if (!values || full.defined()) return;
  full = Tensor::empty({layout.padded_elems}, DType::kF32, mem::Category::kParameters);
  values->gather_all(full);
  gpt.set_hooks(nullptr);
  gpt.params().bind_values(0, layout.num_params(), full);
  if (options.bf16) {  // a whole bf16 copy too, for any forward from here on
    model::ParamStore& ps = gpt.params();
    full_bf16 = Tensor::empty({ps.bf16_elems(0, layout.num_params())}, DType::kBF16,
                              mem::Category::kParameters);
    ps.bind_bf16(0, layout.num_params(), full_bf16);
    ps.refresh_bf16();
  }
}

}  // namespace mt::train

#include "parallel/zero.h"

#include <algorithm>

#include "core/device.h"
#include "core/error.h"
#include "core/profile.h"
#include "kernels/kernels.h"
#include "kernels/mixed.h"

namespace mt::parallel {

namespace {
constexpr int kSlots = 4;
}

int UnitBuffers::slot_of(int unit, int num_units) {
  if (unit == 0) return 0;
  if (unit == num_units - 1) return 1;
  return 2 + (unit - 1) % 2;
}

UnitBuffers::UnitBuffers(const FlatLayout& layout, mem::Category category) : layout_(layout) {
  std::vector<int64_t> elems(kSlots, 0);
  const int U = layout.num_units();
  for (int u = 0; u < U; ++u) {
    auto& e = elems[static_cast<size_t>(slot_of(u, U))];
    e = std::max(e, layout.unit_hi(u) - layout.unit_lo(u));
  }
  for (int64_t e : elems)
    slots_.push_back(e > 0 ? Tensor::zeros({e}, DType::kF32, category) : Tensor());
}

Tensor UnitBuffers::of(int unit) const {
  const Tensor& s = slots_[static_cast<size_t>(slot_of(unit, layout_.num_units()))];
  return s.view(0, {layout_.unit_hi(unit) - layout_.unit_lo(unit)});
}

int64_t UnitBuffers::total_elems() const {
  int64_t n = 0;
  for (const auto& s : slots_) n += s.defined() ? s.numel() : 0;
  return n;
}

// ---- ShardedGrads -----------------------------------------------------------------------

ShardedGrads::ShardedGrads(comm::Group& dp, const FlatLayout& layout)
    : dp_(dp),
      layout_(layout),
      shard_range_(dp.rank(), dp.size(), layout.padded_elems),
      buffers_(layout, mem::Category::kGradients),
      shard_(Tensor::zeros({shard_range_.shard_elems}, DType::kF32, mem::Category::kGradients)),
      in_flight_(kSlots) {
  for (int u = 0; u < layout.num_units(); ++u)
    counts_.push_back(shard_range_.counts(layout.unit_lo(u), layout.unit_hi(u)));
}

void ShardedGrads::zero_shard() {
  if (shard_.numel() == 0) return;
  if (shard_.device() == mem::Device::kCpu)
    kernels::zero(shard_.f32(), shard_.numel());
  else
    shard_.zero_();
}

void ShardedGrads::settle(int slot) {
  InFlight& f = in_flight_[static_cast<size_t>(slot)];
  if (!f.work) return;
  {
    profile::Scope p("dp.wait");
    f.work->wait();
  }
  f.work.reset();
  const int64_t lo = layout_.unit_lo(f.unit);
  const int64_t mine = counts_[static_cast<size_t>(f.unit)][static_cast<size_t>(dp_.rank())];
  if (mine > 0) {
    const int64_t begin = shard_range_.my_begin(lo);
    kernels::accumulate(shard_.f32() + (begin - shard_range_.lo()),
                        unit_grads(f.unit).f32() + (begin - lo), mine);
  }
  f.unit = -1;
}

void ShardedGrads::before_backward(int unit) {
  settle(UnitBuffers::slot_of(unit, layout_.num_units()));
  unit_grads(unit).zero_();
}

void ShardedGrads::after_backward(int unit) {
  const auto& counts = counts_[static_cast<size_t>(unit)];
  const int64_t lo = layout_.unit_lo(unit);
  const int64_t mine = counts[static_cast<size_t>(dp_.rank())];
  Tensor g = unit_grads(unit);
  // In place: this rank's piece is reduced where it lies in the slot.
  const comm::Buf out =
      comm::device_buf(g.f32() + (mine > 0 ? shard_range_.my_begin(lo) - lo : 0), mine);
  InFlight& f = in_flight_[static_cast<size_t>(UnitBuffers::slot_of(unit, layout_.num_units()))];
  MT_ASSERT(!f.work);
  f.work = dp_.reduce_scatter_async(comm::Buf(g), out, counts);
  f.unit = unit;
}

void ShardedGrads::finish() {
  for (int s = 0; s < kSlots; ++s) settle(s);
}

// ---- ShardedParams ----------------------------------------------------------------------

ShardedParams::ShardedParams(comm::Group& dp, const FlatLayout& layout)
    : dp_(dp),
      layout_(layout),
      shard_range_(dp.rank(), dp.size(), layout.padded_elems),
      buffers_(layout, mem::Category::kParameters),
      shard_(Tensor::zeros({shard_range_.shard_elems}, DType::kF32, mem::Category::kParameters)),
      pending_(static_cast<size_t>(layout.num_units())) {
  for (int u = 0; u < layout.num_units(); ++u)
    counts_.push_back(shard_range_.counts(layout.unit_lo(u), layout.unit_hi(u)));
}

ShardedParams::Part ShardedParams::part_of(Ranges ranges) const {
  Part p;
  p.counts.assign(static_cast<size_t>(dp_.size()), 0);
  for (const auto& [a, b] : ranges) {
    const std::vector<int64_t> c = shard_range_.counts(a, b);
    for (size_t r = 0; r < c.size(); ++r) p.counts[r] += c[r];
    const int64_t lo = std::max(a, shard_range_.lo()), hi = std::min(b, shard_range_.hi());
    if (lo < hi) p.mine.emplace_back(lo, hi);
  }
  for (int64_t c : p.counts) p.elems += c;
  p.ranges = std::move(ranges);
  return p;
}

void ShardedParams::gather_in_bf16(const std::vector<Ranges>& bf16_ranges,
                                   const std::vector<Tensor>& bf16_slots) {
  const int U = layout_.num_units();
  MT_ASSERT(static_cast<int>(bf16_ranges.size()) == U && bf16_slots.size() == kSlots);
  split_.assign(static_cast<size_t>(U), Split{});
  bf16_slots_ = bf16_slots;
  const size_t me = static_cast<size_t>(dp_.rank());
  std::vector<int64_t> send_b(kSlots, 0), send_f(kSlots, 0), recv_f(kSlots, 0);
  for (int u = 0; u < U; ++u) {
    const Ranges& bf = bf16_ranges[static_cast<size_t>(u)];
    if (bf.empty()) continue;
    // The rest of the unit: [unit_lo, unit_hi) without the bf16 ranges.
    const int64_t hi = layout_.unit_hi(u);
    Ranges rest;
    int64_t e = layout_.unit_lo(u);
    for (const auto& [a, b] : bf) {
      MT_ASSERT(a >= e && a < b && b <= hi);
      if (a > e) rest.emplace_back(e, a);
      e = b;
    }
    if (e < hi) rest.emplace_back(e, hi);
    Split& s = split_[static_cast<size_t>(u)];
    s.bf16 = part_of(bf);
    s.f32 = part_of(std::move(rest));
    const size_t k = static_cast<size_t>(UnitBuffers::slot_of(u, U));
    MT_ASSERT(bf16_slots_[k].defined() && bf16_slots_[k].numel() >= s.bf16.elems);
    send_b[k] = std::max(send_b[k], s.bf16.counts[me]);
    send_f[k] = std::max(send_f[k], s.f32.counts[me]);
    recv_f[k] = std::max(recv_f[k], s.f32.elems);
  }
  for (size_t k = 0; k < kSlots; ++k) {  // at least one element: a buffer is never empty
    const auto cat = mem::Category::kCommunication;
    send_bf16_.push_back(Tensor::empty({std::max<int64_t>(1, send_b[k])}, DType::kBF16, cat));
    send_f32_.push_back(Tensor::empty({std::max<int64_t>(1, send_f[k])}, DType::kF32, cat));
    recv_f32_.push_back(Tensor::empty({std::max<int64_t>(1, recv_f[k])}, DType::kF32, cat));
  }
}

bool ShardedParams::gathers_bf16(int unit) const {
  return !split_.empty() && !split_[static_cast<size_t>(unit)].bf16.ranges.empty();
}

void ShardedParams::start_split(int unit) {
  const Split& s = split_[static_cast<size_t>(unit)];
  const size_t k = static_cast<size_t>(UnitBuffers::slot_of(unit, layout_.num_units()));
  const float* shard = shard_.f32();
  const int64_t lo = shard_range_.lo();
  // This rank's part of each, packed in flat order: the GEMM weights rounded (only the
  // shard's elements: every rank rounds its own), the rest copied.
  bf16* sb = send_bf16_[k].bf16p();
  int64_t nb = 0;
  {
    profile::Scope p("bf16.weights");
    for (const auto& [a, b] : s.bf16.mine) {
      kernels::to_bf16(sb + nb, shard + (a - lo), b - a);
      nb += b - a;
    }
  }
  float* sf = send_f32_[k].f32();
  int64_t nf = 0;
  for (const auto& [a, b] : s.f32.mine) {
    kernels::copy(sf + nf, shard + (a - lo), b - a);
    nf += b - a;
  }
  const mem::Device dev = device::current();
  Pending& w = pending_[static_cast<size_t>(unit)];
  w.bf16_work = dp_.all_gather_async(
      comm::Buf(sb, nb, DType::kBF16, dev),
      comm::Buf(bf16_slots_[k].bf16p(), s.bf16.elems, DType::kBF16, dev), s.bf16.counts);
  if (s.f32.elems > 0)  // (a unit of GEMM weights alone has no f32 part)
    w.work = dp_.all_gather_async(comm::device_buf(sf, nf),
                                  comm::device_buf(recv_f32_[k].f32(), s.f32.elems), s.f32.counts);
}

void ShardedParams::land_split(int unit) {
  const Split& s = split_[static_cast<size_t>(unit)];
  const size_t k = static_cast<size_t>(UnitBuffers::slot_of(unit, layout_.num_units()));
  float* values = unit_values(unit).f32();
  const float* packed = recv_f32_[k].f32();
  const int64_t lo = layout_.unit_lo(unit);
  int64_t o = 0;
  for (const auto& [a, b] : s.f32.ranges) {
    kernels::copy(values + (a - lo), packed + o, b - a);
    o += b - a;
  }
}

void ShardedParams::start(int unit) {
  auto& w = pending_[static_cast<size_t>(unit)];
  if (w) wait(unit);
  // A gather of another unit into the same slot may still be in flight (a prefetch that a
  // pipeline schedule, running chunks out of model order, did not use yet): let it land and
  // forget it, so that unit is gathered again when it is needed.
  const int U = layout_.num_units(), slot = UnitBuffers::slot_of(unit, U);
  for (int v = 0; v < U; ++v)
    if (v != unit && pending_[static_cast<size_t>(v)] && UnitBuffers::slot_of(v, U) == slot)
      forget(pending_[static_cast<size_t>(v)]);
  if (gathers_bf16(unit)) return start_split(unit);
  const int64_t lo = layout_.unit_lo(unit);
  const auto& counts = counts_[static_cast<size_t>(unit)];
  const int64_t mine = counts[static_cast<size_t>(dp_.rank())];
  const float* src = shard_.f32() + (mine > 0 ? shard_range_.my_begin(lo) - shard_range_.lo() : 0);
  w.work = dp_.all_gather_async(comm::device_buf(const_cast<float*>(src), mine),
                                comm::Buf(unit_values(unit)), counts);
}

void ShardedParams::forget(Pending& w) {
  if (w.bf16_work) w.bf16_work->wait();
  w.bf16_work.reset();
  if (w.work) w.work->wait();
  w.work.reset();
}

void ShardedParams::wait(int unit) {
  auto& w = pending_[static_cast<size_t>(unit)];
  if (!w) start(unit);
  {
    profile::Scope p("dp.wait");
    forget(w);  // landed
  }
  if (gathers_bf16(unit)) land_split(unit);
}

void ShardedParams::before_forward(int unit) {
  wait(unit);  // started by the previous unit's prefetch, or now
  if (unit + 1 < layout_.num_units()) start(unit + 1);
}

void ShardedParams::before_backward(int unit) {
  const int last = layout_.num_units() - 1;
  if (unit == last) {
    // The head reads wte (unit 0) for the input gradient of the tied LM head, and the
    // embedding backward at the very end needs no values: gather unit 0 with the head and
    // keep it; prefetch the last block.
    start(last);
    start(0);
    if (last - 1 > 0) start(last - 1);
    wait(last);
    wait(0);
    return;
  }
  if (unit == 0) return;  // still gathered since the head's backward
  wait(unit);
  if (unit - 1 > 0) start(unit - 1);
}

void ShardedParams::drop_prefetches() {
  for (auto& w : pending_)
    if (w) forget(w);
}

void ShardedParams::gather_all(Tensor& full) {
  MT_ASSERT(full.numel() == layout_.padded_elems);
  dp_.all_gather(comm::Buf(shard_), comm::Buf(full));
}

}  // namespace mt::parallel

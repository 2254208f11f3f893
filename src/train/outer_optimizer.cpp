#include "train/outer_optimizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"
#include "core/write_file.h"
#include "train/replica.h"
#include "train/trainer.h"

namespace mt::train {

namespace fs = std::filesystem;

void check_outer_options(const OuterOptions& o, int dp, const std::string& device, int n_layer,
                         int ep, int64_t steps) {
  const OuterOptions d;
  if (o.sites < 0) fail("--sites {} must be at least 1 (or left out: synchronous dp)", o.sites);
  if (!o.on()) {
    if (o.every != d.every || o.optimizer != d.optimizer || o.lr != d.lr ||
        o.momentum != d.momentum || o.compress != d.compress || o.fragments != d.fragments ||
        o.warmup != d.warmup || o.delay != d.delay || o.mix != d.mix)
      fail(
          "--outer-every, --outer-optimizer, --outer-lr, --outer-momentum, --outer-compress, "
          "--outer-fragments, --outer-warmup-steps, --outer-delay and --outer-mix configure "
          "DiLoCo's outer step: add --sites S (S sites of --dp / S ranks each)");
    return;
  }
  if (dp % o.sites != 0) {
    std::string divisors;
    for (int k = 1; k <= dp; ++k)
      if (dp % k == 0) divisors += fmt::format("{}{}", divisors.empty() ? "" : ", ", k);
    fail(
        "--sites {} does not divide --dp {}: each site takes dp / sites of the data-parallel "
        "ranks (use --sites {}, or a --dp that is a multiple of {})",
        o.sites, dp, divisors, o.sites);
  }
  if (o.every < 1)
    fail("--outer-every {} must be at least 1 (inner steps per outer round; DiLoCo uses 500)",
         o.every);
  if (o.optimizer != "nesterov" && o.optimizer != "average")
    fail(
        "--outer-optimizer '{}' is not an outer optimizer (choose nesterov: SGD with Nesterov "
        "momentum, DiLoCo's; or average: plain averaging)",
        o.optimizer);
  if (!(o.lr > 0) || !std::isfinite(o.lr))
    fail("--outer-lr {} must be a positive number (DiLoCo: 0.7; average: 1)", o.lr);
  if (!(o.momentum >= 0 && o.momentum < 1))
    fail("--outer-momentum {} must be in [0, 1) (DiLoCo: 0.9)", o.momentum);
  if (o.optimizer == "average" && o.momentum != d.momentum)
    fail("--outer-momentum {} has no effect with --outer-optimizer average (use nesterov)",
         o.momentum);
  if (o.fragments < 1 || o.fragments > o.every || o.fragments > n_layer)
    fail(
        "--outer-fragments {} must be between 1 and both --outer-every {} (each fragment is "
        "synchronised at its own inner step of the round) and the model's {} layers",
        o.fragments, o.every, n_layer);
  (void)parse_outer_compress(o.compress);
  if (o.warmup < 0 || o.warmup >= steps)
    fail(
        "--outer-warmup-steps {} must be between 0 and --steps {} - 1 (the synchronous steps "
        "before the first outer round)",
        o.warmup, steps);
  if (o.delay < 0 || (o.delay > 0 && o.delay >= o.every))
    fail(
        "--outer-delay {} must be between 0 and --outer-every {} - 1 (the inner steps a "
        "fragment's exchange overlaps, at most one exchange of a fragment in flight)",
        o.delay, o.every);
  if (o.delay > 0 && o.compress != "none")
    fail(
        "--outer-delay {} overlaps the f32 all-reduce only: --outer-compress {} exchanges in two "
        "dependent steps (use --outer-compress none, or --outer-delay 0)",
        o.delay, o.compress);
  if (!(o.mix >= 0 && o.mix <= 1))
    fail(
        "--outer-mix {} must be in [0, 1] (the share of the site's own values; 0.5 streaming "
        "DiLoCo's)",
        o.mix);
  if (o.delay == 0 && o.mix != d.mix)
    fail("--outer-mix {} mixes after an overlapped exchange: add --outer-delay τ", o.mix);
  if (ep > 1 && (dp / o.sites) % ep != 0)
    fail(
        "--sites {} with --ep {}: each site of --dp {} / {} = {} ranks must hold whole "
        "expert-parallel groups (use --sites {} or fewer with dp / sites a multiple of --ep, or "
        "an --ep that divides {})",
        o.sites, ep, dp, o.sites, dp / o.sites, dp / ep, dp / o.sites);
  if (device != "cpu")
    fail("--sites {} runs on the CPU so far (the outer step is host code): use --device cpu",
         o.sites);
}

float outer_grad_scale(const OuterOptions& o, int64_t batch_tokens) {
  return static_cast<float>(o.site_count()) / static_cast<float>(batch_tokens);
}

Sites::Sites(comm::Group& replica, int sites, int dp_rank, int dp_size, int cp_rank, int cp_size,
             int ep_rank, int ep_size)
    : count_(sites), ep_rank_(ep_rank), job_dp_(dp_size * ep_size) {
  const int per_site = dp_size / sites;
  site_ = dp_rank / per_site;
  const int position = (dp_rank % per_site) * cp_size + cp_rank;
  inner_ = replica.split(site_, position, fmt::format("{}/site[{}]", replica.name(), site_));
  cross_ = replica.split(position, site_, fmt::format("{}/outer[{}]", replica.name(), position));
}

int64_t Sites::outer_recv_bytes() {
  return cross_->recorder().bytes_of_group(cross_->name()).recv_bytes;
}

OuterOptimizer::OuterOptimizer(const OuterOptions& o, Replica& rep, Sites& sites, int world_rank)
    : opts_(o),
      compress_(parse_outer_compress(o.compress)),
      rep_(rep),
      sites_(sites),
      world_rank_(world_rank),
      lo_(rep.shard.lo()),
      n_(rep.shard.shard_elems) {
  // Fragment p: the units (embedding, blocks, head) [p·U/F, (p+1)·U/F) of the rank's model
  // (its pipeline stage), cut to the shard [lo, lo + n); the padding goes with the last unit.
  const parallel::FlatLayout& L = rep.layout;
  const int F = opts_.fragments, U = L.num_units();
  segs_.resize(static_cast<size_t>(F));
  frag_elems_.assign(static_cast<size_t>(F), 0);
  for (int u = 0; u < U; ++u) {
    const int p = std::min(F - 1, static_cast<int>(static_cast<int64_t>(u) * F / U));
    const int64_t a = std::max(L.unit_lo(u), lo_) - lo_;
    const int64_t b = std::min(L.unit_hi(u), lo_ + n_) - lo_;
    if (b <= a) continue;
    auto& segs = segs_[static_cast<size_t>(p)];
    if (!segs.empty() && segs.back().second == a)
      segs.back().second = b;
    else
      segs.emplace_back(a, b);
    frag_elems_[static_cast<size_t>(p)] += b - a;
  }
  split_shared(rep);
  int64_t most = 1, most_sent = 1;
  for (int p = 0; p < F; ++p) {
    most = std::max(most, packed_len(p));
    most_sent = std::max(most_sent, sent_len(p));
  }
  const auto cat = mem::Category::kOptimizer;
  outer_ = Tensor::zeros({std::max<int64_t>(n_, 1)}, DType::kF32, cat);
  if (opts_.optimizer == "nesterov")
    momentum_ = Tensor::zeros({std::max<int64_t>(n_, 1)}, DType::kF32, cat);
  const int S = sites.count();
  const auto comm = mem::Category::kCommunication;
  if (compress_ == OuterCompress::kNone) {
    buf_ = Tensor::zeros({most}, DType::kF32, comm);
  } else {
    // Site j reduces chunk j: chunks of whole blocks, so that both encodings' blocks are the
    // same blocks of the (packed) fragment.
    const int64_t chunk = chunk_of(most_sent);
    const int64_t words = outer_encoded_words(compress_, chunk);
    buf_ = Tensor::zeros({std::max(chunk * S, most)}, DType::kF32, comm);
    send_words_ = Tensor::zeros({words * S}, DType::kI32, comm);
    recv_words_ = Tensor::zeros({words * S}, DType::kI32, comm);
    mine_ = Tensor::zeros({chunk}, DType::kF32, comm);
  }
  if (opts_.delay > 0) {  // one region per fragment: every fragment may be in flight at once
    pend_off_.assign(static_cast<size_t>(F), 0);
    for (int q = 1; q < F; ++q)
      pend_off_[static_cast<size_t>(q)] = pend_off_[static_cast<size_t>(q - 1)] + packed_len(q - 1);
    pend_ = Tensor::zeros({std::max<int64_t>(pend_off_.back() + packed_len(F - 1), 1)}, DType::kF32,
                          comm);
    inflight_.resize(static_cast<size_t>(F));
    lands_.assign(static_cast<size_t>(F), 0);
  }
  if (opts_.observer) {
    const int64_t m = std::max<int64_t>(n_, 1);
    before_ = Tensor::zeros({m}, DType::kF32, cat);
    sent_ = Tensor::zeros({m}, DType::kF32, cat);
    now_ = Tensor::zeros({m}, DType::kF32, cat);
  }
}

// --ep: the dense elements (every element outside an expert's parameters, the padding
// included) are the same on the site's ep ranks; the experts are each rank's own.
void OuterOptimizer::split_shared(Replica& rep) {
  const int F = opts_.fragments;
  order_ = segs_;
  own_elems_ = frag_elems_;
  slice_elems_.assign(static_cast<size_t>(F), 0);
  if (!rep.ep_grads || rep.ep_grads->size() == 1) return;
  shared_ = rep.ep_grads;
  const int64_t E = shared_->size();
  std::vector<std::pair<int64_t, int64_t>> experts;  // shard-relative, ascending
  for (const model::Param& q : rep.gpt.params().params()) {
    if (!q.spec.expert) continue;
    const int64_t a = std::max(q.offset_elems, lo_) - lo_;
    const int64_t b = std::min(q.offset_elems + shape_numel(q.spec.shape), lo_ + n_) - lo_;
    if (b > a) experts.emplace_back(a, b);
  }
  std::sort(experts.begin(), experts.end());
  for (int p = 0; p < F; ++p) {
    std::vector<std::pair<int64_t, int64_t>> own, dense;
    for (auto [a, b] : segs_[static_cast<size_t>(p)]) {
      for (const auto& [x, y] : experts) {
        if (y <= a || x >= b) continue;
        if (x > a) dense.emplace_back(a, x);
        own.emplace_back(std::max(a, x), std::min(b, y));
        a = std::min(b, y);
      }
      if (a < b) dense.emplace_back(a, b);
    }
    int64_t mine = 0;
    for (const auto& [a, b] : own) mine += b - a;
    const int64_t shared = frag_elems_[static_cast<size_t>(p)] - mine;
    own_elems_[static_cast<size_t>(p)] = mine;
    slice_elems_[static_cast<size_t>(p)] = (shared + E - 1) / E;
    own.insert(own.end(), dense.begin(), dense.end());
    order_[static_cast<size_t>(p)] = std::move(own);
  }
  int64_t most = 1;
  for (int p = 0; p < F; ++p) most = std::max(most, slice_elems_[static_cast<size_t>(p)] * E);
  gathered_ = Tensor::zeros({most}, DType::kF32, mem::Category::kCommunication);
}

int64_t OuterOptimizer::packed_len(int p) const {
  if (!shared_) return frag_elems_[static_cast<size_t>(p)];
  return own_elems_[static_cast<size_t>(p)] +
         slice_elems_[static_cast<size_t>(p)] * shared_->size();
}

int64_t OuterOptimizer::sent_len(int p) const {
  return own_elems_[static_cast<size_t>(p)] + slice_elems_[static_cast<size_t>(p)];
}

template <typename Fn>
void OuterOptimizer::each(int p, Fn&& fn) const {
  int64_t k = 0;
  for (const auto& [a, b] : order_[static_cast<size_t>(p)])
    for (int64_t i = a; i < b; ++i) fn(i, k++);
}

// The packed dense elements [own, own + E·slice) (the padding past them zero) to send: this
// ep rank's slice moved to [own, own + slice). The slices it overwrites come back in
// gather_slices.
void OuterOptimizer::move_slice(int p, float* d) const {
  if (!shared_) return;
  const int64_t own = own_elems_[static_cast<size_t>(p)], c = slice_elems_[static_cast<size_t>(p)];
  std::fill(d + frag_elems_[static_cast<size_t>(p)], d + packed_len(p), 0.0f);
  if (shared_->rank() > 0) std::copy_n(d + own + shared_->rank() * c, c, d + own);
}

void OuterOptimizer::gather_slices(int p, float* d) {
  if (!shared_) return;
  const int64_t own = own_elems_[static_cast<size_t>(p)], c = slice_elems_[static_cast<size_t>(p)];
  if (c == 0) return;
  float* g = gathered_.f32();
  shared_->all_gather(comm::Buf(d + own, c), comm::Buf(g, c * shared_->size()));
  std::copy_n(g, c * shared_->size(), d + own);
}

// The mean over the sites of fragment p's packed values: f32 sums divided by S, or the
// compressed exchange's mean.
void OuterOptimizer::exchange(int p, float* d) {
  move_slice(p, d);
  const int64_t sent = sent_len(p);
  if (compress_ == OuterCompress::kNone) {
    comm::Group& cross = sites_.cross();
    cross.all_reduce(comm::Buf(d, sent));
    for (int64_t k = 0; k < sent; ++k) d[k] /= static_cast<float>(cross.size());
  } else {
    exchange_compressed(sent);
  }
  gather_slices(p, d);
}

int64_t OuterOptimizer::chunk_of(int64_t elems) const {
  const int S = sites_.count();
  const int64_t c = std::max<int64_t>(1, (elems + S - 1) / S);
  return (c + kOuterBlock - 1) / kOuterBlock * kOuterBlock;
}

float* OuterOptimizer::site_values() {
  if (rep_.values) return rep_.values->shard_values().f32();
  return rep_.gpt.params().flat_values().f32() + lo_;
}

void OuterOptimizer::begin() {
  if (loaded_) return;
  std::copy_n(site_values(), n_, outer_.f32());
  if (momentum_.defined()) std::fill_n(momentum_.f32(), n_, 0.0f);
  round_step_ = 0;
}

int64_t OuterOptimizer::fragment_offset(int p) const {
  return (static_cast<int64_t>(p) + 1) * opts_.every / opts_.fragments;
}

void OuterOptimizer::average_gradients(int64_t step, float* grads, int64_t n) {
  if (!warming_up(step)) return;
  comm::Group& cross = sites_.cross();
  cross.all_reduce(comm::Buf(grads, n));
  const float S = static_cast<float>(cross.size());
  for (int64_t i = 0; i < n; ++i) grads[i] /= S;
}

bool OuterOptimizer::after_inner_step(int64_t done, int64_t total) {
  if (done <= opts_.warmup) {
    // Synchronous so far: every site holds the same parameters. The first round starts from
    // those after the last warm-up step (momentum 0), the fragments' schedule counted from it.
    if (done == opts_.warmup) {
      loaded_ = false;
      begin();
    }
    return false;
  }
  done -= opts_.warmup;
  total -= opts_.warmup;
  ++round_step_;
  bool stepped = false;
  const bool last = done >= total;
  // --outer-delay: the exchanges that land now (every one still in flight at the end).
  for (int p = 0; p < static_cast<int>(inflight_.size()); ++p)
    if (inflight_[static_cast<size_t>(p)] && (last || lands_[static_cast<size_t>(p)] == done)) {
      land_fragment(p);
      stepped = true;
    }
  for (int p = 0; p < opts_.fragments; ++p) {
    const int64_t off = fragment_offset(p);
    if (!last && (done < off || (done - off) % opts_.every != 0)) continue;
    if (p == opts_.fragments - 1) round_step_ = 0;
    if (opts_.delay > 0 && !last) {
      start_fragment(p);
      lands_[static_cast<size_t>(p)] = std::min(done + opts_.delay, total);
      continue;
    }
    step_fragment(p);
    stepped = true;
  }
  if (stepped) publish();
  return stepped;
}

void OuterOptimizer::step_fragment(int p) {
  const auto& segs = segs_[static_cast<size_t>(p)];
  float* theta = site_values();
  float* outer = outer_.f32();
  float* d = buf_.f32();  // the fragment packed: the mean pseudo-gradient (or parameters)
  if (before_.defined()) std::copy_n(outer, n_, before_.f32());
  const bool average = opts_.optimizer == "average";
  const float lr = opts_.lr;
  if (compress_ == OuterCompress::kNone && average) {
    // Parameter averaging: the sites' parameters summed exactly as they are.
    each(p, [&](int64_t i, int64_t k) { d[k] = theta[i]; });
    exchange(p, d);
    each(p, [&](int64_t i, int64_t k) {
      const float mean = d[k];
      outer[i] = lr == 1.0f ? mean : outer[i] + lr * (mean - outer[i]);
    });
  } else {
    each(p, [&](int64_t i, int64_t k) { d[k] = outer[i] - theta[i]; });
    exchange(p, d);
    apply_mean(p, d);
  }
  ++rounds_;
  if (opts_.observer)
    opts_.observer({rounds_, p, sites_.site(), sites_.position(), sites_.ep_rank(), lo_, n_, &segs,
                    before_.f32(), theta, outer, theta, outer});
  each(p, [&](int64_t i, int64_t) { theta[i] = outer[i]; });
}

void OuterOptimizer::apply_mean(int p, const float* d) {
  float* outer = outer_.f32();
  const float lr = opts_.lr, mu = opts_.momentum;
  if (opts_.optimizer == "average") {
    each(p, [&](int64_t i, int64_t k) { outer[i] -= lr * d[k]; });
  } else {
    float* m = momentum_.f32();
    each(p, [&](int64_t i, int64_t k) {
      m[i] = mu * m[i] + d[k];
      outer[i] -= lr * (d[k] + mu * m[i]);
    });
  }
}

// --outer-delay: the fragment's pseudo-gradient from the site's values now, summed over the
// sites in the background (the cross-site group's progress thread) while the inner steps go
// on; land_fragment takes the sum τ inner steps later.
void OuterOptimizer::start_fragment(int p) {
  const float* theta = site_values();
  const float* outer = outer_.f32();
  float* d = pend_.f32() + pend_off_[static_cast<size_t>(p)];
  each(p, [&](int64_t i, int64_t k) { d[k] = outer[i] - theta[i]; });
  if (sent_.defined()) each(p, [&](int64_t i, int64_t) { sent_.f32()[i] = theta[i]; });
  move_slice(p, d);
  inflight_[static_cast<size_t>(p)] = sites_.cross().all_reduce_async(comm::Buf(d, sent_len(p)));
}

void OuterOptimizer::land_fragment(int p) {
  comm::WorkPtr& work = inflight_[static_cast<size_t>(p)];
  work->wait();
  work.reset();
  const int64_t sent = sent_len(p);
  float* d = pend_.f32() + pend_off_[static_cast<size_t>(p)];
  for (int64_t k = 0; k < sent; ++k) d[k] /= static_cast<float>(sites_.count());
  gather_slices(p, d);
  float* theta = site_values();
  const float* outer = outer_.f32();
  if (before_.defined()) std::copy_n(outer, n_, before_.f32());
  apply_mean(p, d);
  ++rounds_;
  if (now_.defined()) std::copy_n(theta, n_, now_.f32());
  const float a = opts_.mix;
  each(p, [&](int64_t i, int64_t) { theta[i] = a * theta[i] + (1 - a) * outer[i]; });
  if (opts_.observer)
    opts_.observer({rounds_, p, sites_.site(), sites_.position(), sites_.ep_rank(), lo_, n_,
                    &segs_[static_cast<size_t>(p)], before_.f32(), now_.f32(), outer, sent_.f32(),
                    theta});
}

bool OuterOptimizer::exchange_in_flight() const {
  for (const comm::WorkPtr& w : inflight_)
    if (w) return true;
  return false;
}

// Reduce-scatter then all-gather, both on encoded data: site j sums chunk j of every site's
// pseudo-gradient (decoded, in site order, so every site gets the same bits), encodes the
// mean and sends it to all: 2 (S - 1) / S encoded fragments per rank, the ring all-reduce's
// volume at the encoding's width. In: buf_[0, np) this site's; out: the mean.
void OuterOptimizer::exchange_compressed(int64_t np) {
  comm::Group& cross = sites_.cross();
  const int S = cross.size();
  const int64_t chunk = chunk_of(np), words = outer_encoded_words(compress_, chunk);
  float* d = buf_.f32();
  std::fill(d + np, d + chunk * S, 0.0f);
  int32_t* send = send_words_.data<int32_t>();
  int32_t* recv = recv_words_.data<int32_t>();
  for (int j = 0; j < S; ++j) outer_encode(compress_, d + j * chunk, chunk, send + j * words);
  cross.all_to_all(comm::Buf(send, words * S, DType::kI32),
                   comm::Buf(recv, words * S, DType::kI32));
  float* mine = mine_.f32();
  std::fill_n(mine, chunk, 0.0f);
  for (int j = 0; j < S; ++j) {
    outer_decode(compress_, recv + j * words, chunk, d);  // d as scratch
    for (int64_t i = 0; i < chunk; ++i) mine[i] += d[i];
  }
  for (int64_t i = 0; i < chunk; ++i) mine[i] /= static_cast<float>(S);
  outer_encode(compress_, mine, chunk, send);
  cross.all_gather(comm::Buf(send, words, DType::kI32), comm::Buf(recv, words * S, DType::kI32));
  for (int j = 0; j < S; ++j) outer_decode(compress_, recv + j * words, chunk, d + j * chunk);
}

void OuterOptimizer::publish() {
  if (!rep_.values && rep_.dp.size() > 1) {  // every rank of the site holds every value
    Tensor& v = rep_.gpt.params().flat_values();
    rep_.dp.all_gather(comm::device_buf(v.f32() + lo_, n_), comm::Buf(v));
  }
  if (rep_.options.bf16 && !rep_.values) rep_.gpt.params().refresh_bf16();
}

// ---- checkpoints --------------------------------------------------------------------------
//
// outer-rank-NNNNN.bin: a header of kHeaderWords int64 values, then f32 arrays: the outer
// parameters and (nesterov) momentum of [lo, lo + n), and this rank's site model state of its
// optimizer range [opt_lo, opt_hi): master values, AdamW m and v. outer.json (world rank 0):
// the settings a resume must keep.

namespace {
constexpr int64_t kMagic = 0x4f434f4c49440001;  // "DILOCO" + version 1
enum Field {
  kMagicF,
  kSites,
  kEvery,
  kSite,
  kPosition,
  kLo,
  kN,
  kOptLo,
  kOptHi,
  kRound,
  kRounds,
  kMomentum,
  kCrc,
  kFragments,
  kHeaderWords
};

std::string rank_file(const std::string& dir, int rank) {
  return (fs::path(dir) / fmt::format("outer-rank-{:05}.bin", rank)).string();
}
}  // namespace

void OuterOptimizer::save(const std::string& tmp_dir, int64_t step) {
  if (exchange_in_flight())
    fail(
        "step {}: a checkpoint while an overlapped outer exchange is in flight (--outer-delay) "
        "is not supported: checkpoint at the end of the run only (leave --checkpoint-every "
        "out), or use --outer-delay 0",
        step);
  const int64_t opt_n = rep_.opt_elems();
  std::vector<std::pair<const float*, int64_t>> arrays = {{outer_.f32(), n_}};
  if (momentum_.defined()) arrays.emplace_back(momentum_.f32(), n_);
  arrays.emplace_back(rep_.opt_values(), opt_n);
  arrays.emplace_back(rep_.opt->m().f32(), opt_n);
  arrays.emplace_back(rep_.opt->v().f32(), opt_n);
  uint32_t crc = 0;
  for (const auto& [p, n] : arrays) crc = ckpt::crc32c(p, static_cast<size_t>(n) * 4, crc);
  std::vector<int64_t> header(kHeaderWords);
  header[kMagicF] = kMagic;
  header[kSites] = sites_.count();
  header[kEvery] = opts_.every;
  header[kSite] = sites_.site();
  header[kPosition] = sites_.position();
  header[kLo] = lo_;
  header[kN] = n_;
  header[kOptLo] = rep_.opt_lo;
  header[kOptHi] = rep_.opt_hi;
  header[kRound] = round_step_;
  header[kRounds] = rounds_;
  header[kMomentum] = momentum_.defined() ? 1 : 0;
  header[kCrc] = crc;
  header[kFragments] = opts_.fragments;
  std::vector<io::Chunk> chunks = {{header.data(), header.size() * 8}};
  for (const auto& [p, n] : arrays) chunks.push_back({p, static_cast<size_t>(n) * 4});
  io::write_file(rank_file(tmp_dir, world_rank_), chunks);
  if (world_rank_ == 0) {
    const nlohmann::json j = {
        {"format", "meshtrain-diloco"}, {"sites", sites_.count()},
        {"every", opts_.every},         {"fragments", opts_.fragments},
        {"warmup_steps", opts_.warmup}, {"optimizer", opts_.optimizer},
        {"dp", sites_.job_dp()},        {"step", step},
        {"round_step", round_step_},
    };
    io::write_file((fs::path(tmp_dir) / "outer.json").string(), j.dump(1) + "\n");
  }
}

void OuterOptimizer::load(const std::string& dir, int64_t /*step*/) {
  // A synchronous checkpoint (outer_resume_refusal let it through: inside the warm-up): every
  // site loaded the same model and AdamW state; begin() starts the outer state from them.
  if (!fs::exists(fs::path(dir) / "outer.json")) return;
  const std::string path = rank_file(dir, world_rank_);
  std::ifstream in(path, std::ios::binary);
  if (!in)
    fail("checkpoint '{}': the DiLoCo state of rank {} ({}) is missing", dir, world_rank_, path);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
  std::vector<int64_t> h(kHeaderWords);
  if (bytes.size() < h.size() * 8) fail("'{}' is damaged: truncated header", path);
  std::memcpy(h.data(), bytes.data(), h.size() * 8);
  const int64_t opt_n = rep_.opt_elems();
  const int64_t want_momentum = momentum_.defined() ? 1 : 0;
  if (h[kMagicF] != kMagic) fail("'{}' is not a meshtrain DiLoCo state file", path);
  if (h[kSites] != sites_.count() || h[kSite] != sites_.site() ||
      h[kPosition] != sites_.position() || h[kLo] != lo_ || h[kN] != n_ ||
      h[kOptLo] != rep_.opt_lo || h[kOptHi] != rep_.opt_hi || h[kMomentum] != want_momentum ||
      h[kFragments] != opts_.fragments)
    fail(
        "'{}' holds site {} position {} elements [{}, {}) of --sites {} ({} momentum), but this "
        "rank is site {} position {} with [{}, {}) of --sites {}: resume with the layout that "
        "saved it (same --sites, --dp, --tp, --pp, --cp, --zero, --outer-optimizer and "
        "--outer-fragments)",
        path, h[kSite], h[kPosition], h[kLo], h[kLo] + h[kN], h[kSites],
        h[kMomentum] ? "with" : "no", sites_.site(), sites_.position(), lo_, lo_ + n_,
        sites_.count());
  const int64_t floats = (1 + want_momentum) * n_ + 3 * opt_n;
  if (static_cast<int64_t>(bytes.size()) != kHeaderWords * 8 + floats * 4)
    fail("'{}' is damaged: {} bytes, expected {}", path, bytes.size(),
         kHeaderWords * 8 + floats * 4);
  const char* p = bytes.data() + kHeaderWords * 8;
  if (ckpt::crc32c(p, static_cast<size_t>(floats) * 4) != static_cast<uint32_t>(h[kCrc]))
    fail("'{}' is damaged: its checksum does not match", path);
  auto take = [&](float* dst, int64_t n) {
    std::memcpy(dst, p, static_cast<size_t>(n) * 4);
    p += n * 4;
  };
  take(outer_.f32(), n_);
  if (momentum_.defined()) take(momentum_.f32(), n_);
  take(rep_.opt_values(), opt_n);
  take(rep_.opt->m().f32(), opt_n);
  take(rep_.opt->v().f32(), opt_n);
  round_step_ = h[kRound];
  rounds_ = h[kRounds];
  loaded_ = true;
}

std::string outer_resume_refusal(const std::string& dir, int64_t step, const TrainOptions& o) {
  const fs::path file = fs::path(dir) / "outer.json";
  const OuterOptions& w = o.outer;
  if (!fs::exists(file)) {
    // A synchronous checkpoint inside the warm-up: the sites start from it as they would from
    // their own synchronous steps (the DiLoCo paper's start from a model trained in one
    // place: a warm-up that crossed no slow link).
    if (!w.on() || step <= w.warmup) return "";
    return fmt::format(
        "checkpoint '{}' was saved by synchronous training (no DiLoCo state) after step {}: "
        "--sites {} resumes it only as its warm-up (--outer-warmup-steps {} or more: its "
        "synchronous steps count as the warm-up's); or leave --sites out to resume it, or start "
        "the DiLoCo run in another --checkpoint-dir",
        dir, step, w.sites, step);
  }
  nlohmann::json j;
  try {
    std::ifstream in(file);
    j = nlohmann::json::parse(in);
    (void)j.at("sites").get<int>();
    (void)j.at("every").get<int64_t>();
    (void)j.at("dp").get<int>();
    (void)j.at("optimizer").get<std::string>();
  } catch (const std::exception& e) {
    return fmt::format("checkpoint '{}': outer.json is damaged ({})", dir, e.what());
  }
  const int sites = j["sites"];
  const int64_t every = j["every"];
  const int dp = j["dp"];
  const std::string opt = j["optimizer"];
  const int fragments = j.value("fragments", 1);
  const int64_t warmup = j.value("warmup_steps", int64_t{0});
  const std::string keep =
      fmt::format("--dp {} --sites {} --outer-every {} --outer-optimizer {}{}{}", dp, sites, every,
                  opt, fragments > 1 ? fmt::format(" --outer-fragments {}", fragments) : "",
                  warmup > 0 ? fmt::format(" --outer-warmup-steps {}", warmup) : "");
  if (!w.on())
    return fmt::format(
        "checkpoint '{}' holds the DiLoCo state of {} sites (each site's parameters and AdamW "
        "state, the outer parameters and momentum): it resumes only with {} (another site "
        "count, or synchronous training, cannot continue it)",
        dir, sites, keep);
  if (w.sites != sites || o.dp != dp || w.every != every || w.optimizer != opt ||
      w.fragments != fragments || w.warmup != warmup)
    return fmt::format(
        "checkpoint '{}' holds the DiLoCo state of {} and this run asks for --dp {} --sites {} "
        "--outer-every {} --outer-optimizer {} --outer-fragments {} --outer-warmup-steps {}: "
        "resharding to another site count or dp is not supported (resume with {}, or start a "
        "new run in another --checkpoint-dir)",
        dir, keep, o.dp, w.sites, w.every, w.optimizer, w.fragments, w.warmup, keep);
  return "";
}

}  // namespace mt::train

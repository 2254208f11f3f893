#include "train/pipeline_runner.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>

#include "comm/launch.h"
#include "comm/mesh.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/profile.h"
#include "kernels/kernels.h"
#include "kernels/peak.h"
#include "model/gpt.h"
#include "obs/metrics.h"
#include "obs/trace.h"
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/partition.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/verify.h"
#include "train/optimizer.h"
#include "train/token_file.h"

namespace mt::train {

namespace pp = parallel::pp;

namespace {

Tensor acts(const Shape& s) { return Tensor::empty(s, DType::kF32, mem::Category::kActivations); }

// Estimated forward cost per token (FLOPs): a block 24·C² + 4·T·C (docs/flops.md), the
// embedding a lookup (2·C), the head the LM head GEMM plus the softmax (2·C·Vp + 5·Vp).
pp::Partition make_partition(const TrainOptions& o, int chunks) {
  const model::GptConfig& c = o.model;
  const double C = c.d_model, T = c.seq_len, Vp = c.padded_vocab();
  const std::vector<double> layer(static_cast<size_t>(c.n_layer), 24 * C * C + 4 * T * C);
  const double embed = 2 * C, head = 2 * C * Vp + 5 * Vp;
  if (!o.pipeline.layers.empty())
    return pp::explicit_partition(pp::parse_layer_counts(o.pipeline.layers), layer, embed, head,
                                  chunks);
  return pp::balanced_partition(layer, embed, head, chunks);
}

std::vector<model::ParamSpec> stage_specs(const model::GptConfig& c, const pp::Partition& part,
                                          const std::vector<int>& chunks, bool first, bool last) {
  std::vector<bool> mine(static_cast<size_t>(c.n_layer), false);
  for (int ch : chunks)
    for (int l = part.first[ch]; l < part.first[ch + 1]; ++l) mine[l] = true;
  std::vector<model::ParamSpec> out;
  for (const model::ParamSpec& s : model::gpt_param_specs(c)) {
    bool keep = false;
    if (s.layer >= 0)
      keep = mine[s.layer];
    else if (s.name == "transformer.wte.weight")
      keep = first || (last && c.tied);  // tied: the last stage's LM head
    else if (s.name == "transformer.wpe.weight")
      keep = first;
    else
      keep = last;  // final norm, untied lm_head
    if (keep) out.push_back(s);
  }
  return out;
}

// One (microbatch, chunk) in flight: what its backward (and W) reads.
struct Slot {
  int mb = -1, chunk = -1;
  bool held = false;
  Tensor input;   // [N, C] the chunk's input (received, embedded, or copied)
  Tensor dinput;  // [N, C] d(output) received, turned into d(input) in place, sent back
  std::vector<model::BlockActivations> blocks;
  Tensor lnf, lnf_mean, lnf_rstd, logits, losses, lse;  // last chunk
  std::vector<int32_t> tokens, targets;
  struct Stash {  // zero-bubble: the output gradients the weight GEMMs read in W
    Tensor dqkv, dproj, dfch, dmlp;
  };
  std::vector<Stash> stash;
  std::vector<comm::WorkPtr> sends;
};

class StageModel final : public pp::Stage {
 public:
  StageModel(const TrainOptions& o, const pp::Schedule& s, const pp::Partition& part, int pp_rank,
             int64_t mb_size)
      : o_(o),
        c_(o.model),
        s_(s),
        part_(part),
        rank_(pp_rank),
        chunks_(s.chunks_of_rank(pp_rank)),
        first_(pp_rank == s.rank_of_chunk(0)),
        last_(pp_rank == s.rank_of_chunk(s.num_chunks() - 1)),
        params_(stage_specs(o.model, part, chunks_, first_, last_), DType::kF32),
        B_(mb_size),
        T_(o.model.seq_len) {
    params_.initialize(o.seed);  // by global name and element index: the single rank's values
    const int64_t C = c_.d_model, F = c_.d_ff;
    auto get = [&](const std::string& n) { return &params_.get(n); };
    auto maybe = [&](const std::string& n) { return const_cast<model::Param*>(params_.find(n)); };
    if (first_ || (last_ && c_.tied)) wte_ = get("transformer.wte.weight");
    if (first_) wpe_ = get("transformer.wpe.weight");
    if (last_) {
      lm_head_ = c_.tied ? wte_ : get("lm_head.weight");
      ln_f_ = {get("transformer.ln_f.weight"), maybe("transformer.ln_f.bias"), C};
    }
    for (int ch : chunks_)
      for (int l = part.first[ch]; l < part.first[ch + 1]; ++l) {
        const std::string h = "transformer.h." + std::to_string(l) + ".";
        model::Block b;
        b.n_head = c_.n_head;
        b.ln_1 = {get(h + "ln_1.weight"), maybe(h + "ln_1.bias"), C};
        b.c_attn = {get(h + "attn.c_attn.weight"), maybe(h + "attn.c_attn.bias"), C, 3 * C};
        b.attn_proj = {get(h + "attn.c_proj.weight"), maybe(h + "attn.c_proj.bias"), C, C};
        b.ln_2 = {get(h + "ln_2.weight"), maybe(h + "ln_2.bias"), C};
        b.c_fc = {get(h + "mlp.c_fc.weight"), maybe(h + "mlp.c_fc.bias"), C, F};
        b.mlp_proj = {get(h + "mlp.c_proj.weight"), maybe(h + "mlp.c_proj.bias"), F, C};
        blocks_.emplace(l, b);
      }
    for (int ch : chunks_) max_layers_ = std::max(max_layers_, part.layers[ch]);
    scratch_ = model::Block::make_scratch(c_, B_, T_);
    // One more buffer than the schedule's peak: a receive posted early may need it while a
    // released buffer's last send is still in flight. All of them are allocated now: whether
    // the extra one is needed depends on timing, and growing the pool in a later step would
    // allocate in the steady state (it did, under load).
    cap_ = pp::peak_in_flight(s)[pp_rank] + 1;
    for (int i = 0; i < cap_; ++i) grow();
  }

  model::ParamStore& params() { return params_; }
  model::Param* wte() { return wte_; }
  bool first() const { return first_; }
  bool last() const { return last_; }
  const std::vector<int>& chunks() const { return chunks_; }
  int pool_buffers() const { return static_cast<int>(pool_.size()); }
  int held_peak() const { return held_peak_; }
  int64_t buffer_bytes() const { return buffer_bytes_; }

  // Per step: where the samples come from, the loss scale, and the summed loss.
  void begin_step(const SequenceSampler* data, int64_t first_sample, float dloss) {
    data_ = data;
    first_sample_ = first_sample;
    dloss_ = dloss;
    loss_sum_ = 0;
  }
  double loss_sum() const { return loss_sum_; }

  void compute(const pp::Action& a) override {
    switch (a.kind) {
      case pp::ActionKind::kForward:
        forward(a.microbatch, a.chunk);
        break;
      case pp::ActionKind::kBackward:
        backward(a.microbatch, a.chunk, true);
        break;
      case pp::ActionKind::kBackwardInput:
        backward(a.microbatch, a.chunk, false);
        break;
      case pp::ActionKind::kBackwardWeight:
        weight(a.microbatch, a.chunk);
        break;
      default:
        MT_ASSERT(!"not a compute action");
    }
  }
  comm::Buf recv_buffer(const pp::Action& a) override {
    if (a.kind == pp::ActionKind::kRecvAct) return comm::Buf(acquire(a.microbatch, a.chunk).input);
    return comm::Buf(find(a.microbatch, a.chunk).dinput);
  }
  comm::Buf send_buffer(const pp::Action& a) override {
    Slot& s = find(a.microbatch, a.chunk);
    if (a.kind == pp::ActionKind::kSendGrad) return comm::Buf(s.dinput);
    return comm::Buf(s.blocks[static_cast<size_t>(part_.layers[a.chunk] - 1)].out);
  }
  void sent(const pp::Action& a, const comm::WorkPtr& w) override {
    find(a.microbatch, a.chunk).sends.push_back(w);
  }

 private:
  int64_t N() const { return B_ * T_; }

  Slot& find(int mb, int chunk) {
    for (Slot& s : pool_)
      if (s.mb == mb && s.chunk == chunk) return s;
    fail_run("pipeline stage {}: no buffer holds microbatch {} of chunk {}", rank_, mb, chunk);
  }
  Slot* find_or_null(int mb, int chunk) {
    for (Slot& s : pool_)
      if (s.mb == mb && s.chunk == chunk && s.held) return &s;
    return nullptr;
  }
  static bool sends_done(Slot& s) {
    for (auto& w : s.sends)
      if (!w->test()) return false;
    s.sends.clear();
    return true;
  }
  Slot& acquire(int mb, int chunk) {
    if (Slot* s = find_or_null(mb, chunk)) return *s;
    Slot* pick = nullptr;
    for (Slot& s : pool_)
      if (!s.held && sends_done(s)) {
        pick = &s;
        break;
      }
    if (!pick && static_cast<int>(pool_.size()) < cap_) pick = &grow();
    if (!pick) {
      for (Slot& s : pool_)
        if (!s.held) {
          for (auto& w : s.sends) w->wait();
          s.sends.clear();
          pick = &s;
          break;
        }
    }
    MT_ASSERT(pick != nullptr);
    pick->mb = mb;
    pick->chunk = chunk;
    pick->held = true;
    held_peak_ = std::max(held_peak_, ++held_);
    return *pick;
  }
  void release(Slot& s) {
    s.held = false;
    --held_;
  }
  // Buffers are allocated before the first step (the schedule's peak + 1) and kept.
  Slot& grow() {
    const int64_t before = mem::current_tracker().snapshot().of(mem::Category::kActivations);
    const int64_t C = c_.d_model, F = c_.d_ff, n = N();
    Slot s;
    s.input = acts({n, C});
    s.dinput = acts({n, C});
    for (int k = 0; k < max_layers_; ++k)
      s.blocks.push_back(model::Block::make_activations(c_, B_, T_));
    if (last_) {
      s.lnf = acts({n, C});
      s.lnf_mean = acts({n});
      s.lnf_rstd = acts({n});
      s.logits = acts({n, c_.padded_vocab()});
      s.losses = acts({n});
      s.lse = acts({n});
    }
    s.tokens.resize(static_cast<size_t>(n));
    s.targets.resize(static_cast<size_t>(n));
    if (s_.split_backward())
      for (int k = 0; k < max_layers_; ++k)
        s.stash.push_back({acts({n, 3 * C}), acts({n, C}), acts({n, F}), acts({n, C})});
    pool_.push_back(std::move(s));
    buffer_bytes_ = mem::current_tracker().snapshot().of(mem::Category::kActivations) - before;
    return pool_.back();
  }

  int local_first_layer(int chunk) const { return part_.first[chunk]; }

  void forward(int mb, int chunk) {
    Slot& s = acquire(mb, chunk);
    const int64_t C = c_.d_model, n = N();
    const bool is_first = chunk == 0, is_last = chunk == s_.num_chunks() - 1;
    if (is_first || is_last) {
      data_->fill(first_sample_ + mb * B_, B_, s.tokens.data(), s.targets.data());
    }
    if (is_first) {
      profile::Scope p("embedding.fwd");
      kernels::embedding_forward(s.input.f32(), s.tokens.data(), wte_->value.f32(),
                                 wpe_->value.f32(), B_, T_, C);
    } else if (s_.rank_of_chunk(chunk - 1) == rank_) {  // pp = 1: hand over in memory
      Slot& prev = find(mb, chunk - 1);
      std::memcpy(s.input.f32(), prev.blocks[part_.layers[chunk - 1] - 1].out.f32(),
                  static_cast<size_t>(n * C) * sizeof(float));
    }
    const float* x = s.input.f32();
    for (int k = 0; k < part_.layers[chunk]; ++k) {
      blocks_.at(part_.first[chunk] + k).forward(s.blocks[k], x, B_, T_);
      x = s.blocks[k].out.f32();
    }
    if (!is_last) return;
    const int64_t Vp = c_.padded_vocab();
    ln_f_.forward(s.lnf.f32(), s.lnf_mean.f32(), s.lnf_rstd.f32(), x, n);
    {
      profile::Scope p("lm_head.fwd");
      kernels::linear_forward(s.logits.f32(), s.lnf.f32(), lm_head_->value.f32(), nullptr, n, C,
                              Vp);
    }
    {
      profile::Scope p("cross_entropy.fwd");
      kernels::cross_entropy_forward(s.losses.f32(), s.lse.f32(), s.logits.f32(), s.targets.data(),
                                     n, c_.vocab, Vp);
    }
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += s.losses.f32()[i];
    loss_sum_ += sum / static_cast<double>(n);
  }

  // whole = true: Backward (input and weight gradients); false: BackwardInput (W later).
  void backward(int mb, int chunk, bool whole) {
    Slot& s = find(mb, chunk);
    const int64_t C = c_.d_model, n = N(), Vp = c_.padded_vocab();
    const bool is_first = chunk == 0, is_last = chunk == s_.num_chunks() - 1;
    float* dres = s.dinput.f32();
    const int L = part_.layers[chunk];
    if (is_last) {
      float* dlogits = s.logits.f32();
      {
        profile::Scope p("cross_entropy.bwd");
        kernels::cross_entropy_backward(dlogits, s.logits.f32(), s.lse.f32(), s.targets.data(),
                                        dloss_, n, c_.vocab, Vp);
      }
      float* dln = scratch_.dln.f32();
      {
        profile::Scope p("lm_head.bwd");
        kernels::linear_backward(dln, whole ? lm_head_->grad.f32() : nullptr, nullptr, dlogits,
                                 s.lnf.f32(), lm_head_->value.f32(), n, C, Vp);
      }
      s.dinput.zero_();
      const float* out = s.blocks[L - 1].out.f32();
      ln_f_.backward(dres, dln, out, s.lnf_mean.f32(), s.lnf_rstd.f32(), n);
    } else if (s_.rank_of_chunk(chunk + 1) == rank_) {  // pp = 1
      std::memcpy(dres, find(mb, chunk + 1).dinput.f32(),
                  static_cast<size_t>(n * C) * sizeof(float));
    }  // else the gradient was received into dinput
    for (int k = L - 1; k >= 0; --k) {
      const model::Block& b = blocks_.at(part_.first[chunk] + k);
      const float* x = k == 0 ? s.input.f32() : s.blocks[k - 1].out.f32();
      if (whole)
        b.backward(dres, scratch_, s.blocks[k], x, B_, T_);
      else
        block_backward_input(b, dres, s.blocks[k], s.stash[k], x);
    }
    if (!whole) return;
    if (is_first) {
      profile::Scope p("embedding.bwd");
      kernels::embedding_backward(wte_->grad.f32(), wpe_->grad.f32(), dres, s.tokens.data(), B_, T_,
                                  C);
    }
    release(s);
  }

  void weight(int mb, int chunk) {
    Slot& s = find(mb, chunk);
    const int64_t C = c_.d_model, n = N(), Vp = c_.padded_vocab();
    const int L = part_.layers[chunk];
    for (int k = L - 1; k >= 0; --k)
      block_backward_weight(blocks_.at(part_.first[chunk] + k), s.blocks[k], s.stash[k]);
    if (chunk == s_.num_chunks() - 1) {
      profile::Scope p("lm_head.bwd");
      kernels::linear_backward(nullptr, lm_head_->grad.f32(), nullptr, s.logits.f32(), s.lnf.f32(),
                               lm_head_->value.f32(), n, C, Vp);
    }
    if (chunk == 0) {
      profile::Scope p("embedding.bwd");
      kernels::embedding_backward(wte_->grad.f32(), wpe_->grad.f32(), s.dinput.f32(),
                                  s.tokens.data(), B_, T_, C);
    }
    release(s);
  }

  // Zero-bubble B of one block: Block::backward's input-gradient path (layer-norm weights
  // included: they are cheap), stashing the output gradient of each of the four linear
  // layers for W. dres: d(block output) in, d(block input) out.
  void block_backward_input(const model::Block& b, float* dres, const model::BlockActivations& a,
                            Slot::Stash& st, const float* x) {
    const int64_t n = N(), C = c_.d_model, F = c_.d_ff;
    model::BlockScratch& s = scratch_;
    profile::Scope p("block.bwd_input");
    std::memcpy(st.dmlp.f32(), dres, static_cast<size_t>(n * C) * sizeof(float));
    kernels::linear_backward(s.dgelu.f32(), nullptr, nullptr, dres, a.fch_gelu.f32(),
                             b.mlp_proj.w->value.f32(), n, F, C);
    kernels::gelu_backward(st.dfch.f32(), a.fch.f32(), s.dgelu.f32(), n * F);
    kernels::linear_backward(s.dln.f32(), nullptr, nullptr, st.dfch.f32(), a.ln2.f32(),
                             b.c_fc.w->value.f32(), n, C, F);
    b.ln_2.backward(dres, s.dln.f32(), a.res2.f32(), a.ln2_mean.f32(), a.ln2_rstd.f32(), n);
    std::memcpy(st.dproj.f32(), dres, static_cast<size_t>(n * C) * sizeof(float));
    kernels::linear_backward(s.datty.f32(), nullptr, nullptr, dres, a.atty.f32(),
                             b.attn_proj.w->value.f32(), n, C, C);
    kernels::attention_backward(st.dqkv.f32(), s.datt.f32(), s.datty.f32(), a.qkv.f32(),
                                a.att.f32(), B_, T_, C, b.n_head);
    kernels::linear_backward(s.dln.f32(), nullptr, nullptr, st.dqkv.f32(), a.ln1.f32(),
                             b.c_attn.w->value.f32(), n, C, 3 * C);
    b.ln_1.backward(dres, s.dln.f32(), x, a.ln1_mean.f32(), a.ln1_rstd.f32(), n);
  }
  // Zero-bubble W of one block: the four weight (and bias) gradient GEMMs.
  void block_backward_weight(const model::Block& b, const model::BlockActivations& a,
                             const Slot::Stash& st) {
    const int64_t n = N(), C = c_.d_model, F = c_.d_ff;
    profile::Scope p("block.bwd_weight");
    auto lin = [&](const model::Linear& l, const float* dy, const float* in, int64_t i, int64_t o) {
      kernels::linear_backward(nullptr, l.w->grad.f32(), l.b ? l.b->grad.f32() : nullptr, dy, in,
                               l.w->value.f32(), n, i, o);
    };
    lin(b.mlp_proj, st.dmlp.f32(), a.fch_gelu.f32(), F, C);
    lin(b.c_fc, st.dfch.f32(), a.ln2.f32(), C, F);
    lin(b.attn_proj, st.dproj.f32(), a.atty.f32(), C, C);
    lin(b.c_attn, st.dqkv.f32(), a.ln1.f32(), C, 3 * C);
  }

  const TrainOptions& o_;
  const model::GptConfig& c_;
  const pp::Schedule& s_;
  const pp::Partition& part_;
  int rank_;
  std::vector<int> chunks_;
  bool first_, last_;
  model::ParamStore params_;
  int64_t B_, T_;
  model::Param* wte_ = nullptr;
  model::Param* wpe_ = nullptr;
  model::Param* lm_head_ = nullptr;
  model::LayerNorm ln_f_;
  std::map<int, model::Block> blocks_;  // by global layer index
  int max_layers_ = 0;
  model::BlockScratch scratch_;
  std::deque<Slot> pool_;
  int cap_ = 1, held_ = 0, held_peak_ = 0;
  int64_t buffer_bytes_ = 0;
  const SequenceSampler* data_ = nullptr;
  int64_t first_sample_ = 0;
  float dloss_ = 0;
  double loss_sum_ = 0;
};

struct Shared {
  const TrainOptions& o;
  const SequenceSampler& train;
  const pp::Schedule& schedule;
  const pp::Partition& partition;
  int threads;
  int64_t mb_size;
  std::mutex mu;
  TrainResult result;
};

const char* category_of(pp::ActionKind k) {
  switch (k) {
    case pp::ActionKind::kForward:
      return "forward";
    case pp::ActionKind::kBackward:
    case pp::ActionKind::kBackwardInput:
      return "backward";
    case pp::ActionKind::kBackwardWeight:
      return "weight";
    case pp::ActionKind::kSendAct:
    case pp::ActionKind::kSendGrad:
      return "send";
    default:
      return "recv";
  }
}

void run_rank(Shared& sh, comm::Group& world) {
  const TrainOptions& o = sh.o;
  mem::Tracker tracker;
  mem::ScopedTracker track(tracker);
  kernels::set_threads(sh.threads);
  profile::enable(o.profile);
  profile::reset();
  const int P = o.pipeline.pp, D = o.dp;
  comm::DeviceMesh mesh(world, comm::MeshShape({{"pp", P}, {"dp", D}}, world.size()));
  comm::Group& ppg = mesh.group("pp");
  comm::Group& dpg = mesh.group("dp");
  const int p = ppg.rank(), d = dpg.rank();
  const bool lead = world.rank() == 0;
  auto scalars = world.split(0, world.rank(), "pp_scalars");
  // The tied embedding / LM head: first and last stage of each dp replica.
  const bool tied_sync = o.model.tied && P > 1;
  std::unique_ptr<comm::Group> tied;
  if (tied_sync)
    tied = world.split(p == 0 || p == P - 1 ? d : -1, p, "pp_tied[" + std::to_string(d) + "]");

  const pp::Schedule& sched = sh.schedule;
  StageModel stage(o, sched, sh.partition, p, sh.mb_size);
  pp::Executor exec(sched, p, ppg);
  model::ParamStore& ps = stage.params();
  AdamW opt(ps, o.adamw);
  const int64_t T = o.model.seq_len, B = o.batch, m = sched.microbatches;
  const int64_t warmup = o.warmup >= 0 ? o.warmup : o.steps / 20;
  const double flops_per_token = model::training_flops_per_token(o.model, T);
  const double peak =
      o.peak_flops > 0 ? o.peak_flops : kernels::peak_flops(DType::kF32, sh.threads);
  // Elements of the gradient norm this rank owns: all but the last stage's tied wte copy
  // (counted on the first stage), and only on dp rank 0 (the others hold the same sums).
  const model::Param* skip = (tied_sync && p == P - 1) ? stage.wte() : nullptr;

  obs::Progress progress;
  std::unique_ptr<obs::MetricsWriter> metrics;
  if (lead) metrics = std::make_unique<obs::MetricsWriter>(o.metrics);
  const bool talk = lead && !o.quiet;
  if (talk) {
    const std::string split = fmt::format("{}", fmt::join(sh.partition.layers, ","));
    progress.line(fmt::format(
        "meshtrain: model {} ({} layers, d_model {}, {} heads, vocab {}); batch {} x seq {}; "
        "pp {} x dp {} ({} schedule, {} microbatches of {} per step, {} chunk(s) per rank, "
        "layers per chunk {}); {} thread(s) per rank",
        o.model.name, o.model.n_layer, o.model.d_model, o.model.n_head, o.model.vocab, B, T, P, D,
        pp::schedule_kind_name(sched.kind), m, sh.mb_size, sched.virtual_stages, split,
        sh.threads));
  }

  std::vector<StepRecord> steps;
  struct TraceRecord {
    pp::Action action;
    bool wait;
    double start_s, dur_s;
  };
  std::vector<TraceRecord> trace;
  PipelineRankStats st;
  st.rank = world.rank();
  st.pp_rank = p;
  st.dp_rank = d;
  st.chunks = stage.chunks();
  for (int ch : st.chunks) st.chunk_layers.push_back(sh.partition.layers[ch]);
  st.schedule_peak = pp::peak_in_flight(sched)[p];
  int64_t allocations_after_step1 = 0;
  const double run_t0 = now_s();
  for (int64_t step = 0; step < o.steps; ++step) {
    ps.zero_grads();
    const double t0 = now_s();
    stage.begin_step(&sh.train, step * B + d * (B / D), 1.0f / static_cast<float>(B * T));
    exec.run(stage);
    double compute = 0;
    for (const pp::ExecEvent& e : exec.events()) {
      if (e.action.is_compute()) compute += e.end_s - e.start_s;
      if (!o.pipeline.trace.empty())
        trace.push_back({e.action, e.wait, t0 - run_t0 + e.start_s, e.end_s - e.start_s});
    }
    if (tied_sync && tied) tied->all_reduce(comm::Buf(stage.wte()->grad));
    if (D > 1) dpg.all_reduce(comm::Buf(ps.flat_grads()));
    double norm_sq = 0;
    if (d == 0)
      for (const model::Param& prm : ps.params())
        if (&prm != skip) norm_sq += kernels::sum_squares(prm.grad.f32(), prm.grad.numel());
    float sc[2] = {static_cast<float>(p == P - 1 ? stage.loss_sum() : 0.0),
                   static_cast<float>(norm_sq)};
    scalars->all_reduce(comm::Buf(sc, 2));
    const float loss = static_cast<float>(sc[0] / static_cast<double>(m * D));
    if (!std::isfinite(loss))
      fail_run("loss is {} at step {} (lower --lr, raise --warmup, or check the data)", loss,
               step + 1);
    const double norm = std::sqrt(static_cast<double>(sc[1]));
    if (o.grad_clip > 0 && norm > o.grad_clip)
      kernels::scale(ps.flat_grads().f32(), static_cast<float>(o.grad_clip / (norm + 1e-6)),
                     ps.numel());
    const float lr = lr_at(step, warmup, o.steps, o.lr, o.min_lr_ratio);
    opt.step(lr);
    const double dt = now_s() - t0;
    if (step == 0)
      allocations_after_step1 = tracker.snapshot().allocations;
    else {
      st.compute_s += compute;
      st.steps_s += dt;
    }
    StepRecord r;
    r.step = step + 1;
    r.loss = loss;
    r.lr = lr;
    r.grad_norm = norm;
    r.time_s = dt;
    r.tokens_per_s = static_cast<double>(B * T) / dt;
    r.mfu = r.tokens_per_s / (P * D) * flops_per_token / peak;
    r.peak_bytes = tracker.snapshot().total_peak_bytes;
    steps.push_back(r);
    if (metrics)
      metrics->write({{"step", r.step},
                      {"loss", r.loss},
                      {"lr", r.lr},
                      {"grad_norm", r.grad_norm},
                      {"tokens_per_s", r.tokens_per_s},
                      {"mfu", r.mfu},
                      {"peak_bytes", r.peak_bytes},
                      {"time_s", r.time_s}});
    if (talk) {
      const std::string text = fmt::format(
          "step {:>5}/{} | loss {:.4f} | lr {:.2e} | norm {:.3f} | {:.0f} tok/s | MFU {:.1f}% | "
          "{:.0f} ms",
          r.step, o.steps, r.loss, r.lr, r.grad_norm, r.tokens_per_s, 100 * r.mfu, 1000 * dt);
      if (progress.is_terminal() && r.step % 10 != 0 && r.step != o.steps)
        progress.status(text);
      else
        progress.line(text);
    }
  }
  const mem::Snapshot snap = tracker.snapshot();
  st.held_peak = stage.held_peak();
  st.pool_buffers = stage.pool_buffers();
  st.buffer_bytes = stage.buffer_bytes();
  st.activation_peak_bytes = snap.peak_of(mem::Category::kActivations);

  // The trace: every rank's events go to world rank 0 (6 floats each: row, kind, microbatch,
  // chunk, start, duration; kind + 8 marks a receive that blocked), which writes the file.
  if (!o.pipeline.trace.empty()) {
    std::vector<float> mine;
    for (const TraceRecord& e : trace)
      mine.insert(mine.end(),
                  {static_cast<float>(p + P * d),
                   static_cast<float>(static_cast<int>(e.action.kind) + (e.wait ? 8 : 0)),
                   static_cast<float>(e.action.microbatch), static_cast<float>(e.action.chunk),
                   static_cast<float>(e.start_s), static_cast<float>(e.dur_s)});
    float n_mine = static_cast<float>(mine.size());
    std::vector<float> counts_f(static_cast<size_t>(world.size()));
    scalars->all_gather(comm::Buf(&n_mine, 1),
                        comm::Buf(counts_f.data(), static_cast<int64_t>(counts_f.size())));
    std::vector<int64_t> counts;
    int64_t total = 0;
    for (float c : counts_f) {
      counts.push_back(static_cast<int64_t>(c));
      total += counts.back();
    }
    std::vector<float> all(static_cast<size_t>(total));
    scalars->all_gather(comm::Buf(mine.data(), static_cast<int64_t>(mine.size())),
                        comm::Buf(all.data(), total), counts);
    if (lead) {
      std::vector<obs::TraceEvent> events;
      for (size_t i = 0; i + 6 <= all.size(); i += 6) {
        const int code = static_cast<int>(all[i + 1]);
        const bool wait = code >= 8;
        pp::Action a{static_cast<pp::ActionKind>(code % 8), static_cast<int>(all[i + 2]),
                     static_cast<int>(all[i + 3]), -1};
        const std::string name = fmt::format("{}{}{}.{}", wait ? "wait " : "",
                                             pp::action_kind_name(a.kind), a.microbatch, a.chunk);
        events.push_back({static_cast<int>(all[i]), name, wait ? "idle" : category_of(a.kind),
                          all[i + 4], all[i + 5]});
      }
      obs::write_chrome_trace(o.pipeline.trace, events, world.size());
      if (!o.quiet) progress.line(fmt::format("wrote the pipeline trace to {}", o.pipeline.trace));
    }
  }

  std::lock_guard lock(sh.mu);
  TrainResult& res = sh.result;
  if (res.pipeline.size() < static_cast<size_t>(world.size()))
    res.pipeline.resize(static_cast<size_t>(world.size()));
  res.pipeline[static_cast<size_t>(world.rank())] = st;
  if (res.ranks.size() < static_cast<size_t>(world.size()))
    res.ranks.resize(static_cast<size_t>(world.size()));
  RankRecord rec;
  rec.rank = world.rank();
  rec.memory = snap;
  rec.allocations_after_first_step = snap.allocations - allocations_after_step1;
  res.allocations_after_first_step =
      std::max(res.allocations_after_first_step, rec.allocations_after_first_step);
  res.ranks[static_cast<size_t>(world.rank())] = std::move(rec);
  if (lead) res.steps = std::move(steps);
}

}  // namespace

TrainResult run_pipeline_training(const TrainOptions& o) {
  const PipelineOptions& po = o.pipeline;
  if (o.zero != 0)
    fail(
        "--zero {} with --pp {}: ZeRO is not combined with pipeline parallelism yet (use --zero 0)",
        o.zero, po.pp);
  if (o.tp != 1)
    fail(
        "--tp {} with --pp {}: tensor parallelism is not combined with pipeline parallelism yet "
        "(use --tp 1)",
        o.tp, po.pp);
  if (!o.export_path.empty())
    fail("--export with --pp {} is not supported yet (train with --pp 1 to export)", po.pp);
  const pp::ScheduleKind kind = pp::parse_schedule_kind(po.schedule);
  const int m = po.microbatches > 0 ? po.microbatches : po.pp;
  const pp::Schedule sched = pp::build_schedule(kind, po.pp, m, po.virtual_stages);
  pp::verify_or_throw(sched);
  if (o.batch % (static_cast<int64_t>(o.dp) * m) != 0)
    fail(
        "--batch {} is not divisible by --dp {} x --microbatches {} = {} (each pipeline "
        "microbatch holds batch / (dp x microbatches) sequences)",
        o.batch, o.dp, m, o.dp * m);
  const int64_t mb_size = o.batch / o.dp / m;
  if (o.microbatch > 0 && o.microbatch != mb_size)
    fail("--microbatch {} disagrees with --batch {} / (--dp {} x --microbatches {}) = {}",
         o.microbatch, o.batch, o.dp, m, mb_size);
  const pp::Partition part = make_partition(o, sched.num_chunks());

  comm::LaunchOptions lo;
  lo.backend = comm::parse_backend(o.backend);
  const comm::BackendKind bk = comm::resolve_backend(lo);
  const int world = po.pp * o.dp;
  lo.world_size = bk == comm::BackendKind::kMpi ? 0 : world;
  lo.timeout_s = o.comm_timeout_s;
  const int launched = comm::launch_world_size(lo);
  if (launched != world)
    fail("mpirun started {} processes but --pp {} x --dp {} = {}", launched, po.pp, o.dp, world);
  TokenFile file(o.data, o.model.vocab);
  const int64_t total = (file.num_tokens() - 1) / o.model.seq_len;
  const int64_t held =
      o.val_fraction > 0
          ? std::max<int64_t>(total >= 2 ? 1 : 0,
                              static_cast<int64_t>(std::floor(total * o.val_fraction)))
          : 0;
  SequenceSampler train(file, o.model.seq_len, 0, total - held);
  int threads = o.threads;
  if (threads <= 0) {
    int on_host = world;
    if (bk == comm::BackendKind::kMpi)
      if (const char* s = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) on_host = std::atoi(s);
    threads = std::max(1, kernels::host_cores() / std::max(1, on_host));
  }
  Shared sh{o, train, sched, part, threads, mb_size, {}, {}};
  comm::launch(lo, [&](comm::Group& w) { run_rank(sh, w); });
  return std::move(sh.result);
}

}  // namespace mt::train

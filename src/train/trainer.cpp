#include "train/trainer.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
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
#include "parallel/data.h"
#include "parallel/tp.h"
#include "parallel/zero.h"
#include "train/hf_export.h"
#include "train/pipeline_runner.h"
#include "train/token_file.h"

namespace mt::train {

void TrainOptions::validate() const {
  model.validate();
  if (batch < 1) fail("--batch {} must be at least 1", batch);
  if (microbatch < 0) fail("--microbatch {} must be at least 1", microbatch);
  if (dp < 1) fail("--dp {} must be at least 1", dp);
  model::check_tp(model, tp, sp);  // tensor parallelism: refusals naming the valid --tp
  if (zero < 0 || zero > 3) fail("--zero {} must be 0, 1, 2 or 3", zero);
  if (!(bucket_mb > 0)) fail("--bucket-mb {} must be positive", bucket_mb);
  // Each dp rank takes batch / dp consecutive samples of the global batch, in microbatches.
  if (batch % dp != 0 || microbatch_size() < 1 || batch % (dp * microbatch_size()) != 0) {
    if (dp == 1)
      fail("--microbatch {} does not divide --batch {} (choose a divisor of {})", microbatch_size(),
           batch, batch);
    if (microbatch > 0)
      fail(
          "--batch {} is not divisible by --dp {} x --microbatch {} = {} (use a --batch that "
          "is a multiple of {}, or change --dp / --microbatch)",
          batch, dp, microbatch, dp * microbatch, dp * microbatch);
    fail(
        "--batch {} is not divisible by --dp {} (every dp rank takes batch / dp samples; use "
        "--batch {} or {}, or a --dp that divides {})",
        batch, dp, batch / dp * dp > 0 ? batch / dp * dp : dp, (batch / dp + 1) * dp, batch);
  }
  if (steps < 1) fail("--steps {} must be at least 1", steps);
  if (!(lr > 0) || !std::isfinite(lr)) fail("--lr {} must be a positive number", lr);
  if (data.empty())
    fail("no training data: pass --data FILE.bin (make one with `meshtrain prepare`)");
  if (val_fraction < 0 || val_fraction >= 1)
    fail("validation fraction {} must be in [0, 1)", val_fraction);
}

namespace {

struct Splits {
  std::unique_ptr<TokenFile> train_file, val_file;
  std::unique_ptr<SequenceSampler> train, val;
};

Splits make_splits(const TrainOptions& o) {
  const int64_t T = o.model.seq_len;
  Splits s;
  s.train_file = std::make_unique<TokenFile>(o.data, o.model.vocab);
  const int64_t total = (s.train_file->num_tokens() - 1) / T;
  if (!o.val_data.empty()) {
    s.val_file = std::make_unique<TokenFile>(o.val_data, o.model.vocab);
    s.train = std::make_unique<SequenceSampler>(*s.train_file, T, 0, total);
    s.val =
        std::make_unique<SequenceSampler>(*s.val_file, T, 0, (s.val_file->num_tokens() - 1) / T);
    return s;
  }
  // Hold out the last val_fraction of the sequences (at least one when there are two).
  int64_t held = static_cast<int64_t>(std::floor(total * o.val_fraction));
  if (o.val_fraction > 0 && held == 0 && total >= 2) held = 1;
  s.train = std::make_unique<SequenceSampler>(*s.train_file, T, 0, total - held);
  if (held > 0) s.val = std::make_unique<SequenceSampler>(*s.train_file, T, total - held, held);
  return s;
}

// The global batch `step` is samples [step·B, step·B + B); dp rank d of D takes
// [step·B + d·B/D, step·B + (d+1)·B/D), in microbatches of mb. The same numbering serves
// validation (batch k of the held-out split), so neither depends on the layout.
int64_t first_sample(int64_t step, int64_t B, int d, int D, int64_t m, int64_t mb) {
  return step * B + d * (B / D) + m * mb;
}

parallel::FlatLayout flat_layout(const model::Gpt& gpt) {
  parallel::FlatLayout l;
  for (const auto& p : gpt.params().params()) l.param_offsets.push_back(p.offset_elems);
  l.param_offsets.push_back(gpt.params().numel());
  l.unit_first_param = gpt.unit_first_params();
  l.padded_elems = gpt.params().padded_numel();
  return l;
}

// Intra-op threads of one rank: cores on this host shared by the ranks on this host.
int rank_threads(const TrainOptions& o, comm::BackendKind backend) {
  if (o.threads > 0) return o.threads;
  int on_host = o.dp * o.tp;
  if (backend == comm::BackendKind::kMpi)
    if (const char* s = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) on_host = std::atoi(s);
  return std::max(1, kernels::host_cores() / std::max(1, on_host));
}

// The data-parallel machinery of one rank for its ZeRO stage: which full-size buffers
// exist, where the optimizer's shard is, and the hooks that reduce and gather.
//   stage 0: full values, full grads, bucketed all-reduce, AdamW on everything
//   stage 1: full values, full grads, bucketed reduce-scatter, AdamW on the shard, all-gather
//   stage 2: full values, shard grads (+ unit pool), per-unit reduce-scatter, AdamW on the
//            shard, all-gather
//   stage 3: shard values and grads (+ unit pools), per-unit all-gather before forward and
//            backward, per-unit reduce-scatter, AdamW on the shard
struct Replica {
  Replica(const TrainOptions& o, comm::Group& dp_group, parallel::tp::TpContext tp_ctx = {})
      : dp(dp_group),
        zero(o.zero),
        gpt(o.model, o.seed, model::StoreOptions{dp_group.size(), o.zero < 3, o.zero < 2}, tp_ctx),
        layout(flat_layout(gpt)),
        shard(dp_group.rank(), dp_group.size(), layout.padded_elems) {
    model::ParamStore& ps = gpt.params();
    const auto& first = layout.unit_first_param;
    if (zero >= 2) {
      grads = std::make_unique<parallel::ShardedGrads>(dp, layout);
      for (int u = 0; u < layout.num_units(); ++u)
        ps.bind_grads(first[u], first[u + 1], grads->unit_grads(u));
    }
    if (zero == 3) {
      values = std::make_unique<parallel::ShardedParams>(dp, layout);
      for (int u = 0; u < layout.num_units(); ++u)
        ps.bind_values(first[u], first[u + 1], values->unit_values(u));
      // Layout independence: the shard draws its own elements of the global init.
      ps.initialize_range(o.seed, shard.lo(), shard.shard_elems, values->shard_values().f32());
      chain = std::make_unique<parallel::HookChain>(
          std::vector<parallel::UnitHooks*>{values.get(), grads.get()});
      gpt.set_hooks(chain.get());
    } else if (zero == 2) {
      gpt.set_hooks(grads.get());
    } else if (dp.size() > 1 || zero == 1) {
      const int64_t bucket_elems =
          std::max<int64_t>(1, static_cast<int64_t>(o.bucket_mb * (1 << 20)) / 4);
      buckets = std::make_unique<parallel::BucketReducer>(
          dp, layout, ps.flat_grads(),
          zero == 0 ? parallel::BucketReducer::Mode::kAllReduce
                    : parallel::BucketReducer::Mode::kReduceScatter,
          bucket_elems);
      gpt.set_hooks(buckets.get());
    }
    // Stage 0 updates every element; the others only the shard.
    opt_lo = zero == 0 ? 0 : shard.lo();
    opt_hi = zero == 0 ? ps.numel() : shard.hi();
    opt = std::make_unique<AdamW>(ps, o.adamw, opt_lo, opt_hi);
    // Tensor parallelism: replicated parameters (layer norms, row-parallel biases, wpe).
    for (const auto& p : ps.params())
      if (p.spec.tp_split == model::TpSplit::kReplicated)
        replicated.emplace_back(p.offset_elems, p.offset_elems + shape_numel(p.spec.shape));
    if (tp_ctx.sp) {  // layer norms, wpe: their gradients are sums over one sequence shard
      std::vector<std::pair<int64_t, int64_t>> partial;
      for (int i : gpt.sequence_parallel_params()) {
        const model::Param& p = ps.params()[static_cast<size_t>(i)];
        partial.emplace_back(p.offset_elems, p.offset_elems + shape_numel(p.spec.shape));
      }
      tp_sync = std::make_unique<parallel::tp::ReplicatedGradSync>(partial, opt_lo, opt_hi);
    }
  }
  // Squared norm of this rank's owned gradients, counting a replicated parameter on tp rank
  // 0 only (the sum over all ranks then counts every element of the model once).
  double owned_norm_sq() {
    const auto& tp = gpt.tp();
    if (!tp.active()) return kernels::sum_squares(owned_grads(), owned_elems());
    const float* g = owned_grads();
    const int64_t lo = shard.lo(), hi = shard.hi();
    double sum = 0;
    size_t k = 0;  // next replicated range
    for (int64_t e = lo; e < hi;) {
      while (k < replicated.size() && replicated[k].second <= e) ++k;
      const bool in_rep = k < replicated.size() && replicated[k].first <= e;
      const int64_t end = std::min(
          hi, in_rep ? replicated[k].second : (k < replicated.size() ? replicated[k].first : hi));
      if (!in_rep || tp.rank == 0) sum += kernels::sum_squares(g + (e - lo), end - e);
      e = end;
    }
    return sum;
  }

  void begin_step() {
    if (grads)
      grads->zero_shard();
    else
      gpt.params().zero_grads();
  }
  void begin_microbatch(bool last) {
    if (buckets) buckets->set_enabled(last);  // DDP / ZeRO-1 reduce once per step
  }
  void end_backward() {
    if (buckets) buckets->finish();
    if (grads) grads->finish();
    if (tp_sync) tp_sync->sync(gpt.tp(), opt_grads());  // --sp: sum the partial sums over tp
  }
  // This rank's reduced gradients: each element of [0, Ψp) is owned by exactly one rank,
  // so the squares summed over owned ranges and then over ranks count each once.
  float* owned_grads() {
    if (grads) return grads->shard_grads().f32();
    return gpt.params().flat_grads().f32() + shard.lo();
  }
  int64_t owned_elems() const { return shard.shard_elems; }
  // What clipping scales: everything this rank's optimizer reads.
  float* opt_grads() {
    if (grads) return grads->shard_grads().f32();
    return gpt.params().flat_grads().f32() + opt_lo;
  }
  float* opt_values() {
    if (values) return values->shard_values().f32();
    return gpt.params().flat_values().f32() + opt_lo;
  }
  void optimizer_step(float lr) {
    opt->step(lr, opt_values(), opt_grads());
    if (zero == 1 || zero == 2) {  // every rank needs every updated value again
      Tensor& v = gpt.params().flat_values();
      dp.all_gather(comm::Buf(v.f32() + shard.lo(), shard.shard_elems), comm::Buf(v));
    }
  }
  // ZeRO-3: gathers the final weights into a full buffer and points the views there (for
  // export and the tests); the hooks are off from here on.
  void materialize_full() {
    if (!values) return;
    full = Tensor::empty({layout.padded_elems}, DType::kF32, mem::Category::kParameters);
    values->gather_all(full);
    gpt.set_hooks(nullptr);
    gpt.params().bind_values(0, layout.num_params(), full);
  }
  const float* full_values() { return values ? full.f32() : gpt.params().flat_values().f32(); }

  comm::Group& dp;
  int zero;
  model::Gpt gpt;
  parallel::FlatLayout layout;
  parallel::Shard shard;
  std::unique_ptr<parallel::BucketReducer> buckets;
  std::unique_ptr<parallel::ShardedGrads> grads;
  std::unique_ptr<parallel::ShardedParams> values;
  std::unique_ptr<parallel::HookChain> chain;
  std::unique_ptr<AdamW> opt;
  int64_t opt_lo = 0, opt_hi = 0;
  Tensor full;
  std::vector<std::pair<int64_t, int64_t>> replicated;  // flat ranges of replicated params
  std::unique_ptr<parallel::tp::ReplicatedGradSync> tp_sync;
};

// Mean loss over the first `batches` global batches of the held-out split; each rank
// evaluates its share (the same samples as training's sharding picks).
float evaluate(Replica& r, model::Activations& acts, const SequenceSampler& val, int64_t batches,
               int64_t B, int64_t n_micro, comm::Group* scalars, std::vector<int32_t>& in,
               std::vector<int32_t>& tgt) {
  double sum = 0;
  const int64_t mb = acts.B;
  for (int64_t k = 0; k < batches; ++k)
    for (int64_t m = 0; m < n_micro; ++m) {
      val.fill(first_sample(k, B, r.dp.rank(), r.dp.size(), m, mb), mb, in.data(), tgt.data());
      sum += r.gpt.forward(acts, in.data(), tgt.data());
    }
  if (r.gpt.tp().rank != 0) sum = 0;  // every tp rank has the same loss: count it once
  if (scalars) {
    float s = static_cast<float>(sum);
    scalars->all_reduce(comm::Buf(&s, 1));
    sum = s;
  }
  return static_cast<float>(sum / static_cast<double>(batches * n_micro * r.dp.size()));
}

// The worst rank's peak bytes. An int64 travels as the bits of two f32 elements through an
// all-gather, which copies and never does arithmetic on them.
int64_t worst_peak(comm::Group* scalars, int64_t mine) {
  if (!scalars) return mine;
  std::vector<int64_t> all(static_cast<size_t>(scalars->size()));
  scalars->all_gather(comm::Buf(reinterpret_cast<float*>(&mine), 2),
                      comm::Buf(reinterpret_cast<float*>(all.data()), 2 * scalars->size()));
  return *std::max_element(all.begin(), all.end());
}

// Tensor parallelism: the whole model from the tp group's shards (an all-gather of each
// parameter over tp, every slice put back where for_each_tp_run says), as a single-rank
// Gpt (the vocabulary padded to 128 again; the extra tp padding rows are zero). Collective
// over `tp`; returns the model on tp rank 0, nullptr elsewhere.
std::unique_ptr<model::Gpt> gather_tp_shards(const model::Gpt& gpt, comm::Group& tp,
                                             const model::GptConfig& config, uint64_t seed) {
  std::unique_ptr<model::Gpt> whole;
  if (tp.rank() == 0) whole = std::make_unique<model::Gpt>(config, seed);
  const auto& mine = gpt.params().params();
  std::vector<float> gathered, global;
  for (size_t i = 0; i < mine.size(); ++i) {
    const model::ParamSpec& spec = mine[i].spec;
    const int64_t n = shape_numel(spec.shape);
    gathered.resize(static_cast<size_t>(n * tp.size()));
    tp.all_gather(comm::Buf(const_cast<float*>(mine[i].value.f32()), n),
                  comm::Buf(gathered.data(), n * tp.size()));
    if (!whole) continue;
    global.assign(static_cast<size_t>(shape_numel(spec.full_shape())), 0.f);
    for (int r = 0; r < tp.size(); ++r) {
      model::ParamSpec rs = spec;
      rs.tp_rank = r;
      model::for_each_tp_run(rs, [&](int64_t lf, int64_t gf, int64_t len) {
        std::copy_n(gathered.begin() + r * n + lf, len, global.begin() + gf);
      });
    }
    model::Param& dst = whole->params().params()[i];
    std::copy_n(global.begin(), dst.value.numel(), dst.value.f32());  // drops tp-only padding
  }
  return whole;
}

struct Shared {
  const TrainOptions& o;
  const Splits& data;
  int threads;
  std::mutex mu;
  TrainResult result;
};

void run_rank(Shared& sh, comm::Group& world) {
  const TrainOptions& o = sh.o;
  mem::Tracker tracker;
  mem::ScopedTracker track(tracker);
  kernels::set_threads(sh.threads);
  profile::enable(o.profile);  // per thread: each rank's own
  profile::reset();
  comm::DeviceMesh mesh(world, comm::MeshShape({{"dp", o.dp}, {"tp", o.tp}}, world.size()));
  comm::Group& dp = mesh.group("dp");
  comm::Group& tp_group = mesh.group("tp");
  const int D = dp.size(), d = dp.rank();
  const bool lead = world.rank() == 0;
  // Scalars (loss, norm, peak bytes) travel on their own group so that the dp group's byte
  // counters hold exactly the gradient and parameter traffic.
  std::unique_ptr<comm::Group> scalars_group;
  if (D > 1 && o.tp == 1)
    scalars_group = dp.split(
        0, d, "dp_scalars[" + std::to_string(mesh.shape().group_index({"dp"}, world.rank())) + "]");
  else if (o.tp > 1)
    scalars_group = world.split(0, world.rank(), "scalars");
  comm::Group* scalars = scalars_group.get();

  obs::Progress progress;
  std::unique_ptr<obs::MetricsWriter> metrics;
  if (lead) metrics = std::make_unique<obs::MetricsWriter>(o.metrics);
  const bool talk = lead && !o.quiet;

  Replica rep(o, dp,
              o.tp > 1 ? parallel::tp::TpContext::of(tp_group, o.sp) : parallel::tp::TpContext{});
  const int64_t T = o.model.seq_len, B = o.batch, mb = o.microbatch_size();
  const int64_t n_micro = B / D / mb;
  model::Activations acts = rep.gpt.make_activations(mb, T);
  std::vector<int32_t> inputs(mb * T), targets(mb * T);
  const int64_t warmup = o.warmup >= 0 ? o.warmup : o.steps / 20;
  const double flops_per_token = model::training_flops_per_token(o.model, T);
  const double peak =
      o.peak_flops > 0 ? o.peak_flops : kernels::peak_flops(DType::kF32, sh.threads);
  const Splits& data = sh.data;

  if (talk)
    progress.line(fmt::format(
        "meshtrain: model {} ({} layers, d_model {}, {} heads, vocab {} padded to {}), {:.2f}M "
        "parameters; batch {} x seq {}; dp {} (ZeRO-{}, {} backend){}, {} microbatch(es) of {} "
        "per rank; {} thread(s) per rank; data {} ({} train sequences)",
        o.model.name, o.model.n_layer, o.model.d_model, o.model.n_head, o.model.vocab,
        rep.gpt.config().padded_vocab(),
        model::count_params(model::gpt_param_specs(rep.gpt.config())) / 1e6, B, T, D, o.zero,
        world.backend_kind(),
        o.tp > 1 ? fmt::format(", tp {}{}", o.tp, o.sp ? " with sequence parallelism" : "") : "",
        n_micro, mb, sh.threads, o.data, data.train->num_samples()));

  RankRecord rec;
  rec.rank = world.rank();
  std::vector<StepRecord> steps;
  std::vector<std::pair<int64_t, float>> val_losses;
  int64_t allocations_after_step1 = 0;
  comm::ByteCount before = dp.recorder().bytes_of_group(dp.name());
  comm::ByteCount tp_before = tp_group.recorder().bytes_of_group(tp_group.name());
  for (int64_t step = 0; step < o.steps; ++step) {
    const double t0 = now_s();
    rep.begin_step();
    double loss_sum = 0;
    for (int64_t m = 0; m < n_micro; ++m) {
      rep.begin_microbatch(m == n_micro - 1);
      data.train->fill(first_sample(step, B, d, D, m, mb), mb, inputs.data(), targets.data());
      loss_sum += rep.gpt.forward(acts, inputs.data(), targets.data());
      rep.gpt.backward(acts, 1.0f / static_cast<float>(B * T));
    }
    rep.end_backward();
    // Global loss and gradient norm: sums over ranks of this rank's shares.
    double norm_sq = rep.owned_norm_sq();
    if (o.tp > 1 && tp_group.rank() != 0) loss_sum = 0;  // the tp ranks agree: count once
    if (scalars) {
      float s[2] = {static_cast<float>(loss_sum), static_cast<float>(norm_sq)};
      scalars->all_reduce(comm::Buf(s, 2));
      loss_sum = s[0];
      norm_sq = s[1];
    }
    const float loss = static_cast<float>(loss_sum / static_cast<double>(n_micro * D));
    if (!std::isfinite(loss))
      fail_run("loss is {} at step {} (lower --lr, raise --warmup, or check the data)", loss,
               step + 1);
    const double norm = std::sqrt(norm_sq);
    if (o.grad_clip > 0 && norm > o.grad_clip)
      kernels::scale(rep.opt_grads(), static_cast<float>(o.grad_clip / (norm + 1e-6)),
                     rep.opt_hi - rep.opt_lo);
    const float lr = lr_at(step, warmup, o.steps, o.lr, o.min_lr_ratio);
    rep.optimizer_step(lr);
    const double dt = now_s() - t0;
    if (step == 0) allocations_after_step1 = tracker.snapshot().allocations;

    const comm::ByteCount now = dp.recorder().bytes_of_group(dp.name());
    rec.step_sent_bytes.push_back(now.sent_bytes - before.sent_bytes);
    rec.step_recv_bytes.push_back(now.recv_bytes - before.recv_bytes);
    before = now;
    const comm::ByteCount tp_now = tp_group.recorder().bytes_of_group(tp_group.name());
    rec.step_tp_recv_bytes.push_back(tp_now.recv_bytes - tp_before.recv_bytes);
    tp_before = tp_now;

    StepRecord r;
    r.step = step + 1;
    r.loss = loss;
    r.lr = lr;
    r.grad_norm = norm;
    r.time_s = dt;
    r.tokens_per_s = static_cast<double>(B * T) / dt;
    r.mfu = r.tokens_per_s / (D * o.tp) * flops_per_token / peak;
    r.peak_bytes = worst_peak(scalars, tracker.snapshot().total_peak_bytes);
    r.comm_bytes = rec.step_recv_bytes.back();
    steps.push_back(r);

    nlohmann::json row = {{"step", r.step},
                          {"loss", r.loss},
                          {"lr", r.lr},
                          {"grad_norm", r.grad_norm},
                          {"tokens_per_s", r.tokens_per_s},
                          {"mfu", r.mfu},
                          {"peak_bytes", r.peak_bytes},
                          {"time_s", r.time_s},
                          {"comm_bytes", r.comm_bytes}};
    const bool eval_now =
        data.val && ((o.eval_every > 0 && r.step % o.eval_every == 0) || r.step == o.steps);
    if (eval_now) {
      const int64_t batches =
          std::max<int64_t>(1, std::min(o.eval_batches, data.val->num_samples() / B));
      const float vl =
          evaluate(rep, acts, *data.val, batches, B, n_micro, scalars, inputs, targets);
      val_losses.emplace_back(r.step, vl);
      row["val_loss"] = vl;
    }
    if (metrics) metrics->write(row);
    if (talk) {
      std::string text = fmt::format(
          "step {:>5}/{} | loss {:.4f} | lr {:.2e} | norm {:.3f} | {:.0f} tok/s | MFU {:.1f}% | "
          "peak {} | comm {} | {:.0f} ms",
          r.step, o.steps, r.loss, r.lr, r.grad_norm, r.tokens_per_s, 100 * r.mfu,
          obs::human_bytes(static_cast<double>(r.peak_bytes)),
          obs::human_bytes(static_cast<double>(r.comm_bytes)), 1000 * dt);
      if (row.contains("val_loss"))
        text += fmt::format(" | val loss {:.4f}", row["val_loss"].get<float>());
      if (progress.is_terminal() && !row.contains("val_loss") && r.step % 10 != 0 &&
          r.step != o.steps)
        progress.status(text);
      else
        progress.line(text);
    }
  }
  rec.allocations_after_first_step = tracker.snapshot().allocations - allocations_after_step1;
  rec.memory = tracker.snapshot();

  if (o.profile && talk) {
    double total = 0;
    for (const auto& [name, e] : profile::entries()) total += e.time_s;
    progress.line(fmt::format("profile over {} steps (time in each kind of kernel):", o.steps));
    std::vector<std::pair<std::string, profile::Entry>> rows(profile::entries().begin(),
                                                             profile::entries().end());
    std::sort(rows.begin(), rows.end(),
              [](auto& a, auto& b) { return a.second.time_s > b.second.time_s; });
    for (const auto& [name, e] : rows)
      progress.line(fmt::format("  {:<20} {:>9.3f} s {:>6.1f}%  {:>7} calls", name, e.time_s,
                                100 * e.time_s / total, e.calls));
  }
  rep.materialize_full();
  if (o.keep_final_params) {
    const float* v = rep.full_values();
    rec.final_params.assign(v, v + rep.gpt.params().numel());
  }
  if (!o.export_path.empty() && o.tp > 1 && d == 0) {
    // The tp group of dp rank 0 gathers its shards; world rank 0 writes the whole model.
    std::unique_ptr<model::Gpt> whole = gather_tp_shards(rep.gpt, tp_group, o.model, o.seed);
    if (lead) export_hf_safetensors(*whole, o.export_path);
  } else if (lead && !o.export_path.empty()) {
    export_hf_safetensors(rep.gpt, o.export_path);
  }
  if (lead && !o.export_path.empty() && !o.quiet)
    progress.line(fmt::format("exported weights to {}", o.export_path));

  std::lock_guard lock(sh.mu);
  TrainResult& res = sh.result;
  if (res.ranks.size() < static_cast<size_t>(world.size()))
    res.ranks.resize(static_cast<size_t>(world.size()));
  res.allocations_after_first_step =
      std::max(res.allocations_after_first_step, rec.allocations_after_first_step);
  res.ranks[static_cast<size_t>(world.rank())] = std::move(rec);
  if (lead) {
    res.steps = std::move(steps);
    res.val_losses = std::move(val_losses);
    res.padded_params = rep.layout.padded_elems;
    res.gathered_param_elems = rep.values ? rep.values->pool_elems() : 0;
    res.gradient_pool_elems = rep.grads ? rep.grads->pool_elems() : 0;
    if (o.keep_final_params) {
      const float* v = rep.full_values();
      res.final_params.assign(v, v + rep.gpt.params().numel());
    }
  }
}

}  // namespace

TrainResult run_training(const TrainOptions& o) {
  o.validate();
  if (o.pipeline.pp != 1) return run_pipeline_training(o);
  comm::LaunchOptions lo;
  lo.backend = comm::parse_backend(o.backend);
  const comm::BackendKind kind = comm::resolve_backend(lo);
  lo.world_size = kind == comm::BackendKind::kMpi ? 0 : o.dp * o.tp;
  lo.timeout_s = o.comm_timeout_s;
  const int world = comm::launch_world_size(lo);
  if (o.tp > 1 && world != o.dp * o.tp)
    fail("mpirun started {} processes but --dp {} x --tp {} is {} (run mpirun -np {})", world, o.dp,
         o.tp, o.dp * o.tp, o.dp * o.tp);
  if (world != o.dp * o.tp)
    fail("mpirun started {} processes but --dp is {} (pass --dp {}, or run mpirun -np {})", world,
         o.dp, world, o.dp);
  const Splits data = make_splits(o);  // read-only, shared by the rank threads
  Shared sh{o, data, rank_threads(o, kind), {}, {}};
  comm::launch(lo, [&](comm::Group& w) { run_rank(sh, w); });
  return std::move(sh.result);
}

}  // namespace mt::train

#include "train/trainer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>

#include "comm/hosts.h"
#include "comm/launch.h"
#include "comm/mesh.h"
#include "comm/mpi.h"
#include "comm/simulated_link.h"
#include "core/clock.h"
#include "core/device.h"
#include "core/error.h"
#include "core/profile.h"
#include "kernels/kernels.h"
#include "kernels/peak.h"
#include "model/gpt.h"
#include "obs/metrics.h"
#include "obs/run_info.h"
#include "obs/tensorboard.h"
#include "parallel/context.h"
#include "parallel/data.h"
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/verify.h"
#include "parallel/tp.h"
#include "parallel/zero.h"
#include "train/checkpoint.h"
#include "train/data_splits.h"
#include "train/evaluate.h"
#include "train/gather_model.h"
#include "train/hf_export.h"
#include "train/host_share.h"
#include "train/init_from.h"
#include "train/moe_report.h"
#include "train/nonfinite.h"
#include "train/outer_optimizer.h"
#include "train/output_paths.h"
#include "train/pipeline_stage.h"
#include "train/rank_placement.h"
#include "train/replica.h"
#include "train/run_records.h"
#include "train/stop_signals.h"

namespace mt::train {

namespace {

struct Shared {
  const TrainOptions& o;
  const Splits& data;
  const HfWeights* init;  // --init-from, read once for every rank thread; null: none
  int threads;
  const parallel::pp::Schedule* schedule;    // --pp > 1
  const parallel::pp::Partition* partition;  // --pp > 1
  std::mutex mu;
  TrainResult result;
  // The attempt stopped on non-finite steps: restarting it would repeat them.
  bool nonfinite_stop = false;
};

void run_rank(Shared& sh, comm::Group& world_in) {
  const TrainOptions& o = sh.o;
  mem::Tracker tracker;
  mem::ScopedTracker track(tracker);
  // Processes on several hosts (mpirun over a hostfile): the world ordered host by host, so
  // that the mesh's fastest dimensions (tp first) fall inside a host (docs/multihost.md).
  comm::HostMap hosts;  // by the job's world rank
  std::unique_ptr<comm::Group> by_host;
  if (world_in.backend_kind() == "mpi" && world_in.size() > 1) {
    hosts = comm::exchange_host_names(world_in);
    by_host = comm::order_by_host(world_in, hosts, "world");
  }
  comm::Group& world = by_host ? *by_host : world_in;
  // Before the first allocation: tensors go to the thread's device.
  if (o.device == "cuda")
    device::use_cuda(gpu_of_rank(world.rank()));
  else
    device::use_cpu();  // under mpirun this is the main thread: nothing left from a GPU run
  kernels::set_fused_attention(o.fused_attention());  // before the buffers are sized
  kernels::set_threads(sh.threads);
  profile::enable(o.profile);  // per thread: each rank's own
  profile::reset();
  comm::DeviceMesh mesh(world, make_mesh_shape(o, world.size()));
  // The data-parallel ranks (each its own samples): dp, or with --ep the mesh's dp x ep.
  comm::Group& dp = o.ep > 1 ? mesh.group({"dp", "ep"}) : mesh.group("dp");
  comm::Group& tp_group = mesh.group("tp");
  comm::Group& ppg = mesh.group("pp");
  comm::Group& cpg = mesh.group("cp");
  comm::Group& epg = mesh.group("ep");
  // Gradients are reduced (and ZeRO shards) over dp x cp: the cp ranks of a replica hold the
  // same parameters and each computes their gradient from its part of the sequences. With
  // --ep that is the ranks holding the same experts (the mesh's dp = dp / ep); the dense
  // parameters' gradients are summed over the ep ranks too, on a group of their own.
  comm::Group& job_grads_group =
      o.cp > 1 ? mesh.group({"dp", "cp"}) : (o.ep > 1 ? mesh.group("dp") : dp);
  std::unique_ptr<comm::Group> ep_grads;
  if (world.size() > 1)  // collective over the world: every rank splits
    ep_grads = world.split(o.ep > 1 ? mesh.shape().group_index({"ep"}, world.rank()) : -1,
                           epg.rank(), "ep_grads[" + epg.name().substr(3));
  // DiLoCo (--sites): gradients and ZeRO stay inside a site (train/outer_optimizer.h). With
  // --ep the sites are cut from the expert-dp group (the mesh's dp: ep | dp / S, so a site
  // holds whole ep groups): the cross-site group joins the ranks holding the same experts.
  std::unique_ptr<Sites> sites;
  if (o.outer.on()) {
    comm::Group& site_dp = o.ep > 1 ? mesh.group("dp") : dp;
    sites = std::make_unique<Sites>(job_grads_group, o.outer.sites, site_dp.rank(), site_dp.size(),
                                    o.cp > 1 ? mesh.group("cp").rank() : 0, o.cp,
                                    o.ep > 1 ? epg.rank() : 0, o.ep);
  }
  comm::Group& grads_group = sites ? sites->inner() : job_grads_group;
  if (o.sim_link_mbit > 0)  // the link between sites, simulated (docs/diloco.md)
    comm::simulate_link(sites ? sites->cross() : job_grads_group, o.sim_link_mbit * 1e6 / 8,
                        o.sim_link_ms / 1e3);
  const int D = dp.size(), d = dp.rank(), P = ppg.size(), p = ppg.rank(), CP = cpg.size();
  const bool lead = world.rank() == 0;
  // Scalars (loss, norm, peak bytes) travel on their own group so that the byte counters
  // of dp, tp and pp hold exactly the model's traffic.
  std::unique_ptr<comm::Group> scalars_group;
  if (world.size() > 1) scalars_group = world.split(0, world.rank(), "scalars");
  comm::Group* scalars = scalars_group.get();
  // On several hosts: which dimensions' groups span hosts (empty on one host).
  const std::string placement = host_placement(mesh, hosts, scalars);
  // The tied embedding / LM head: the first and the last stage of each (dp, tp) position.
  const bool tied_sync = o.model.tied && P > 1;
  std::unique_ptr<comm::Group> tied;
  if (tied_sync) {
    const int pos = (d * CP + cpg.rank()) * o.tp + tp_group.rank();
    tied = world.split(p == 0 || p == P - 1 ? pos : -1, p, "tied[" + std::to_string(pos) + "]");
  }

  obs::Progress progress;
  const bool talk = lead && !o.quiet;

  ReplicaOptions ro;
  ro.zero = o.zero;
  ro.bucket_mb = o.bucket_mb;
  ro.pipelined = P > 1;
  ro.skip_tied_copy_in_norm = tied_sync && p == P - 1;
  ro.bf16 = o.dtype == "bf16";
  Replica rep(o.model, o.seed, o.adamw, ro, grads_group,
              o.tp > 1 ? parallel::tp::TpContext::of(tp_group, o.sp) : parallel::tp::TpContext{},
              P > 1 ? stage_parts(*sh.schedule, *sh.partition, p) : model::StageParts{},
              o.ep > 1 ? parallel::ep::EpContext::of(epg) : parallel::ep::EpContext{},
              ep_grads.get());
  rep.gpt.set_recompute(model::parse_recompute(o.recompute));
  std::unique_ptr<OuterOptimizer> outer;
  if (sites) outer = std::make_unique<OuterOptimizer>(o.outer, rep, *sites, world.rank());
  rep.gpt.set_moe_options(o.moe);
  if (o.routing_tape) rep.gpt.set_routing_tape(o.routing_tape.get(), o.record_routing);
  if (CP > 1)
    rep.gpt.set_context_parallel(
        parallel::cp::CpContext::of(cpg, parallel::cp::parse_cp_comm(o.cp_comm)));
  // T: a sequence; Tl: this rank's rows of it (T / cp).
  const int64_t T = o.model.seq_len, Tl = rep.gpt.local_seq_len(), B = o.batch,
                mb = o.microbatch_size();
  const int64_t n_micro = o.microbatches_per_step();
  std::unique_ptr<PipelineStage> stage;
  std::unique_ptr<parallel::pp::Executor> exec;
  model::Activations acts;
  if (P > 1) {
    stage = std::make_unique<PipelineStage>(rep.gpt, *sh.schedule, *sh.partition, p, mb);
    exec = std::make_unique<parallel::pp::Executor>(*sh.schedule, p, ppg);
  } else {
    acts = rep.gpt.make_activations(mb, Tl);
  }
  std::vector<int32_t> inputs(mb * Tl), targets(mb * Tl);
  const int64_t warmup = o.warmup >= 0 ? o.warmup : o.steps / 20;
  const double flops_per_token = model::training_flops_per_token(o.model, T);
  const DType gemm_dtype = ro.bf16 ? DType::kBF16 : DType::kF32;
  // The peak of what this rank really has: its share of the cores (affinity masks of the
  // host's ranks) or of its GPU (train/host_share.h). Collective, on the scalars group:
  // the model's groups count only the model's traffic.
  const RankPeak peak_of =
      o.peak_flops > 0 ? RankPeak{o.peak_flops, 0, device::on_cuda()}
                       : rank_peak_flops(scalars, gemm_dtype, sh.threads,
                                         device::on_cuda() ? gpu_of_rank(world.rank()) : -1);
  const double peak = peak_of.flops;
  ImpossibleMfuWarning mfu_warning;
  const Splits& data = sh.data;

  if (talk) {
    std::string layout =
        fmt::format("dtype {}{}{}; dp {} (ZeRO-{}, {} backend)", o.dtype,
                    ro.bf16 ? " (bf16 GEMMs, f32 master weights)" : "",
                    o.fused_attention() ? ", flash attention" : ", naive attention", D, o.zero,
                    world.backend_kind());
    if (sites)
      layout += fmt::format(
          " in {} DiLoCo sites of {} (outer step every {} inner steps: {}, lr {}{}, {} exchange{})",
          sites->count(), D / sites->count(), o.outer.every, o.outer.optimizer, o.outer.lr,
          o.outer.optimizer == "nesterov" ? fmt::format(", momentum {}", o.outer.momentum) : "",
          o.outer.compress == "none" ? std::string("f32") : o.outer.compress,
          o.outer.fragments > 1 ? fmt::format(", streaming in {} fragments", o.outer.fragments)
                                : "");
    if (CP > 1)
      layout += fmt::format(", cp {} ({} exchange, causal load-balanced split)", CP, o.cp_comm);
    if (o.ep > 1)
      layout += fmt::format(", ep {} ({} of the {} experts per rank, carved from dp)", o.ep,
                            o.model.moe.n_experts / o.ep, o.model.moe.n_experts);
    if (o.tp > 1)
      layout += fmt::format(", tp {}{}", o.tp, o.sp ? " with sequence parallelism" : "");
    if (P > 1)
      layout += fmt::format(
          ", pp {} ({} schedule, {} chunk(s) per rank, layers per chunk {}{})", P,
          parallel::pp::schedule_kind_name(sh.schedule->kind), sh.schedule->virtual_stages,
          fmt::join(sh.partition->layers, ","),
          sh.schedule->lowering == parallel::pp::Lowering::kBatched ? ", batched exchanges" : "");
    progress.line(fmt::format(
        "meshtrain: model {} ({} layers, d_model {}, {} heads{}, vocab {} padded to {}), {:.2f}M "
        "parameters; batch {} x seq {}; {}; mesh {}{}; {} microbatch(es) of {} per step and "
        "replica; recompute {}; {}; data {} ({}; {} train sequences{})",
        o.model.name, o.model.n_layer, o.model.d_model, o.model.n_head,
        o.model.llama_family() || o.model.kv_heads() != o.model.n_head
            ? fmt::format(" sharing {} kv heads, {}, rotary positions (theta {}{}), {} d_ff {}",
                          o.model.kv_heads(), model::norm_name(o.model.norm), o.model.rope_theta,
                          o.model.rope_scaling.llama3 ? ", llama3 scaling" : "",
                          model::mlp_name(o.model.mlp), o.model.d_ff)
            : "",
        o.model.vocab, rep.gpt.config().padded_vocab(),
        model::count_params(model::gpt_param_specs(o.model)) / 1e6, B, T, layout, o.mesh_order,
        placement.empty() ? "" : " on " + placement, n_micro, mb, o.recompute,
        device::on_cuda() ? fmt::format("device {}", device::describe(mem::Device::kCuda,
                                                                      device::current_index()))
                          : fmt::format("{} thread(s) per rank", sh.threads),
        o.data, data.train_data->describe(), data.train->num_samples(),
        o.shuffle ? ", shuffled by --seed each epoch" : ", in file order"));
    warn_about_small_data(o, data, progress);
  }

  // Checkpoints: restore (--resume), then save every --checkpoint-every steps.
  const ckpt::RankGroups groups{world, grads_group, tp_group, ppg, outer.get()};
  int64_t start_in_row = 0;  // non-finite steps skipped in a row up to the checkpoint
  const int64_t start_step = ckpt::resume(o, groups, rep, talk, &start_in_row);
  // Not into a failure seen before (every rank reads the marker: all refuse alike).
  refuse_known_nonfinite_start(o, start_step, talk);
  if (o.stop_after > 0 && start_step >= o.stop_after)
    fail("--stop-after {}: the checkpoint resumed is of step {}, past it (leave it out to go on)",
         o.stop_after, start_step);
  // A checkpoint wins over --init-from: a restarted fine-tuning run goes on from it.
  if (start_step == 0 && sh.init) {
    init_from_weights(rep, *sh.init, o.model);
    if (talk) progress.line(fmt::format("initialised from {}", o.init_from));
  }
  if (outer) outer->begin();  // a round from the parameters as they are now
  // A resumed run continues the metrics file: the rows of the steps up to the checkpoint
  // stay, those after it (trained again now) go.
  std::unique_ptr<obs::MetricsWriter> metrics;
  if (lead) metrics = std::make_unique<obs::MetricsWriter>(o.metrics, start_step);
  // The same scalars as TensorBoard events (tags: the metrics keys).
  std::unique_ptr<obs::TensorBoardWriter> tensorboard;
  if (lead && !o.tensorboard.empty())
    tensorboard = std::make_unique<obs::TensorBoardWriter>(o.tensorboard);

  RankRecord rec;
  rec.rank = world.rank();
  std::vector<StepRecord> steps;
  std::vector<std::pair<int64_t, float>> val_losses;
  std::vector<PipelineTraceEvent> trace;
  PipelineRankStats st;
  st.rank = world.rank();
  st.pp_rank = p;
  st.dp_rank = d;
  if (stage) {
    st.chunks = stage->chunks();
    for (int ch : st.chunks) st.chunk_layers.push_back(sh.partition->layers[ch]);
    st.schedule_peak = parallel::pp::peak_in_flight(*sh.schedule)[p];
  }
  int64_t allocations_after_step1 = 0;
  auto bytes_of = [](comm::Group& g) { return g.recorder().bytes_of_group(g.name()).recv_bytes; };
  // This rank's byte counters over each mesh dimension; a step's traffic is the difference.
  // dp: the gradient traffic (over dp x cp with context parallelism); cp: the attention's.
  struct Bytes {
    int64_t dp, dp_sent, tp, pp, cp, ep, outer;
  };
  auto bytes_now = [&] {
    const bool e = o.ep > 1 && ep_grads;
    return Bytes{bytes_of(grads_group) + (e ? bytes_of(*ep_grads) : 0),
                 grads_group.recorder().bytes_of_group(grads_group.name()).sent_bytes +
                     (e ? ep_grads->recorder().bytes_of_group(ep_grads->name()).sent_bytes : 0),
                 bytes_of(tp_group),
                 bytes_of(ppg),
                 bytes_of(cpg),
                 bytes_of(epg),
                 sites ? sites->outer_recv_bytes() : 0};
  };
  // Each site's loss gradient is the mean over its own sequences (S / (B T); 1 / (B T)).
  const float grad_scale = outer_grad_scale(o.outer, B * T);
  std::vector<float> scalar_buf(4 + (sites ? static_cast<size_t>(sites->count()) : 0));
  Bytes before = bytes_now();
  NonFiniteGuard guard(o.skip_nonfinite, start_in_row);
  int64_t newest_saved = start_step;  // 0: none (from scratch, nothing saved yet)
  int64_t stopped_at = 0;             // a signal stopped the run after this step
  bool stopped_early = false;         // a signal, or --stop-after: the run has not finished
  const double run_t0 = now_s();
  for (int64_t step = start_step; step < o.steps; ++step) {
    // --profile leaves the first step out: its first touches of every buffer (page faults,
    // oneDNN's primitive creation) would be counted in whichever kernel wrote first.
    if (o.profile && step == start_step + 1) profile::reset();
    const double t0 = now_s();
    rep.begin_step();
    double loss_sum = 0, compute = 0;
    if (stage) {
      stage->begin_step(data.train.get(), first_sample(step, B, d, D, 0, mb), grad_scale);
      exec->run(*stage);
      loss_sum = stage->loss_sum();
      for (const parallel::pp::ExecEvent& e : exec->events()) {
        if (e.action.is_compute()) compute += e.end_s - e.start_s;
        if (!o.pipeline.trace.empty())
          trace.push_back({e.action, e.wait, t0 - run_t0 + e.start_s, e.end_s - e.start_s});
      }
      if (tied) tied->all_reduce(comm::Buf(rep.gpt.wte()->grad));
    } else {
      for (int64_t m = 0; m < n_micro; ++m) {
        rep.begin_microbatch(m == n_micro - 1);
        acts.routing_sample = first_sample(step, B, d, D, m, mb);
        data.train->fill(acts.routing_sample, mb, inputs.data(), targets.data(),
                         rep.gpt.local_positions());
        loss_sum += rep.gpt.forward(acts, inputs.data(), targets.data());
        rep.gpt.backward(acts, grad_scale);
      }
    }
    rep.end_backward();
    if (outer) outer->average_gradients(step, rep.opt_grads(), rep.opt_elems());  // warm-up
    // Global loss and gradient norm: sums over ranks of this rank's shares; with them, in the
    // same all-reduce over the whole world, what every rank must decide alike before the
    // optimizer step: a non-finite value on some rank (train/nonfinite.h), a stop asked for
    // by a signal (train/stop_signals.h).
    double norm_sq = rep.owned_norm_sq();
    if (tp_group.rank() != 0 || p != P - 1) loss_sum = 0;  // count each loss once
    const bool bad_here = !std::isfinite(loss_sum) || !std::isfinite(norm_sq);
    double sums[4] = {loss_sum, norm_sq, bad_here ? 1.0 : 0.0,
                      StopSignals::requested() != 0 ? 1.0 : 0.0};
    // --sites: each site clips by its own norm; the squared norms travel one slot per site.
    double site_norm_sq = norm_sq;
    if (scalars) {
      float* f = scalar_buf.data();
      for (int i = 0; i < 4; ++i) f[i] = static_cast<float>(sums[i]);
      if (sites) {
        std::fill(f + 4, f + scalar_buf.size(), 0.0f);
        f[4 + sites->site()] = static_cast<float>(norm_sq);
      }
      scalars->all_reduce(comm::Buf(f, static_cast<int64_t>(scalar_buf.size())));
      for (int i = 0; i < 4; ++i) sums[i] = f[i];
      if (sites) site_norm_sq = f[4 + sites->site()];
    }
    // Each cp rank's loss is the mean over its rows: the sequences' mean is their mean.
    const float loss = static_cast<float>(sums[0] / static_cast<double>(n_micro * D * CP));
    // Warm-up (--outer-warmup-steps): every site holds the same averaged gradient, its norm.
    const double norm =
        std::sqrt(outer && outer->warming_up(step) ? sums[1] / sites->count() : sums[1]);
    const double clip_norm = sites ? std::sqrt(site_norm_sq) : norm;
    const bool nonfinite = sums[2] > 0 || !std::isfinite(loss) || !std::isfinite(norm);
    const bool stop_asked = sums[3] > 0;
    // Mixture of experts: the step's routing counters of every MoE layer, the job's sums
    // (each replica and stage once: tp ranks hold the same numbers).
    std::optional<MoeReport> moe;
    if (o.model.moe.enabled()) {
      std::vector<float> counters = moe_counters(rep.gpt, tp_group.rank() == 0);
      if (scalars && !counters.empty())
        scalars->all_reduce(comm::Buf(counters.data(), static_cast<int64_t>(counters.size())));
      moe = summarise_moe(counters, o.model, o.moe);
      rep.gpt.reset_moe_stats();
      // --moe-balance bias: the selection biases follow the step's load (not after a step
      // that changes nothing).
      if (o.moe.balance_bias && !nonfinite)
        update_moe_bias(rep.gpt.moe_bias(), counters, o.model, o.moe.bias_rate);
    }
    const bool give_up = guard.record(nonfinite);
    const float lr = lr_at(step, warmup, o.steps, o.lr, o.min_lr_ratio);
    if (!nonfinite) {  // a non-finite step changes nothing: no clipping, no update
      // Clipping scales the gradients as the update reads them (no pass of its own).
      const float clip = o.grad_clip > 0 && clip_norm > o.grad_clip
                             ? static_cast<float>(o.grad_clip / (clip_norm + 1e-6))
                             : 1.0f;
      rep.optimizer_step(lr, clip);
    }
    const bool outer_step = outer && outer->after_inner_step(step + 1, o.steps);
    device::synchronize();  // a GPU's step ends when its kernels have
    const double dt = now_s() - t0;
    // Bytes this rank received in the step over each mesh dimension (the optimizer's
    // all-gather included); gathered with the peak bytes and the compute time below.
    const Bytes now = bytes_now();
    rec.step_recv_bytes.push_back(now.dp - before.dp);
    rec.step_sent_bytes.push_back(now.dp_sent - before.dp_sent);
    rec.step_tp_recv_bytes.push_back(now.tp - before.tp);
    rec.step_pp_recv_bytes.push_back(now.pp - before.pp);
    rec.step_cp_recv_bytes.push_back(now.cp - before.cp);
    rec.step_ep_recv_bytes.push_back(now.ep - before.ep);
    rec.step_outer_recv_bytes.push_back(now.outer - before.outer);
    // One gather per step: each rank's peak bytes, bytes per dimension and compute time
    // (ns): the worst peak and the job's sums, exact.
    const std::vector<int64_t> ranks = gather_int64(
        scalars, {tracker.snapshot().total_peak_bytes, now.dp - before.dp, now.tp - before.tp,
                  now.pp - before.pp, now.cp - before.cp, now.ep - before.ep,
                  static_cast<int64_t>(compute * 1e9), now.outer - before.outer});
    before = now;
    if (step == start_step) {
      allocations_after_step1 = tracker.snapshot().allocations;
    } else {
      st.compute_s += compute;
      st.steps_s += dt;
    }

    StepRecord r;
    r.step = step + 1;
    r.loss = loss;
    r.lr = lr;
    r.grad_norm = norm;
    r.skipped = nonfinite;
    r.time_s = dt;
    r.tokens_per_s = static_cast<double>(B * T) / dt;
    r.mfu = r.tokens_per_s / world.size() * flops_per_token / peak;
    if (talk) mfu_warning.check(r.mfu, peak_of, o.peak_flops > 0);
    int64_t job[7] = {};  // dp, tp, pp, cp, ep bytes, compute ns, outer bytes: sums over ranks
    for (size_t k = 0; k < ranks.size(); k += 8) {
      if (ranks[k] > r.peak_bytes) {
        r.peak_bytes = ranks[k];
        r.worst_rank = static_cast<int>(k / 8);
      }
      for (int i = 0; i < 7; ++i) job[i] += ranks[k + 1 + static_cast<size_t>(i)];
    }
    r.comm_bytes = rec.step_recv_bytes.back();
    r.dp_bytes = static_cast<double>(job[0]);
    r.tp_bytes = static_cast<double>(job[1]);
    r.pp_bytes = static_cast<double>(job[2]);
    r.cp_bytes = static_cast<double>(job[3]);
    r.ep_bytes = static_cast<double>(job[4]);
    if (moe) r.moe_shadowed = moe->shadowed;
    r.outer_bytes = static_cast<double>(job[6]);
    r.outer_step = outer_step;
    if (P > 1)
      r.bubble = std::max(0.0, 1 - static_cast<double>(job[5]) * 1e-9 / (world.size() * dt));
    steps.push_back(r);

    nlohmann::json row = {{"step", r.step},
                          {"loss", r.loss},
                          {"lr", r.lr},
                          {"grad_norm", r.grad_norm},
                          {"tokens_per_s", r.tokens_per_s},
                          {"mfu", r.mfu},
                          {"peak_bytes", r.peak_bytes},
                          {"peak_rank", r.worst_rank},
                          {"time_s", r.time_s},
                          {"comm_bytes", r.comm_bytes},
                          {"dp_bytes", r.dp_bytes},
                          {"tp_bytes", r.tp_bytes},
                          {"pp_bytes", r.pp_bytes}};
    row["tokens"] = r.step * B * T;  // trained on so far (the x axis of loss vs tokens)
    if (CP > 1) row["cp_bytes"] = r.cp_bytes;
    if (o.ep > 1) row["ep_bytes"] = r.ep_bytes;
    if (sites) {
      row["outer_bytes"] = r.outer_bytes;
      row["outer_step"] = r.outer_step;
    }
    if (P > 1) row["bubble"] = r.bubble;
    if (moe) {
      row["moe"] = moe_json(*moe);
      row["moe_aux_loss"] = moe->aux_loss;
      row["moe_z_loss"] = moe->z_loss;
    }
    if (step == start_step) {
      row["run"] = run_header(o, sh.threads, world, rep.gpt.config());
      // What MFU divides by (rank 0's): units 0 when --peak-gflops gave it.
      row["run"]["mfu_peak"] = {{"flops", peak_of.flops},
                                {peak_of.gpu ? "gpus" : "cores", peak_of.units}};
    }
    // The last step: every rank's peak bytes by category (a collective: all ranks join).
    if (r.step == o.steps) row["memory_by_rank"] = memory_by_rank(scalars, tracker);
    if (nonfinite) row["skipped"] = true;  // (a NaN loss or norm is written as null)
    const bool eval_now =
        data.val && ((o.eval_every > 0 && r.step % o.eval_every == 0) || r.step == o.steps);
    if (eval_now) {
      const int64_t batches =
          std::max<int64_t>(1, std::min(o.eval_batches, data.val->num_samples() / B));
      const bool profiling = profile::enabled();  // the profile is of training steps
      profile::enable(false);
      const float vl = evaluate(rep, d, D, &acts, stage.get(), ppg, *data.val, batches, B, n_micro,
                                mb, scalars, inputs, targets);
      profile::enable(profiling);
      val_losses.emplace_back(r.step, vl);
      row["val_loss"] = vl;
      // The validation's traffic (pipeline activations) is not the next step's. The cross-site
      // groups carry none of it, but an overlapped outer exchange (--outer-delay) may complete
      // on their progress thread meanwhile: its bytes stay counted (in the next step).
      const int64_t outer_before = before.outer;
      before = bytes_now();
      before.outer = outer_before;
    }
    if (metrics) metrics->write(row);
    if (tensorboard) {
      for (const char* key :
           {"loss", "val_loss", "lr", "grad_norm", "tokens_per_s", "mfu", "peak_bytes", "time_s",
            "dp_bytes", "tp_bytes", "pp_bytes", "cp_bytes", "ep_bytes", "outer_bytes", "bubble",
            "moe_aux_loss", "moe_z_loss"})
        if (row.contains(key)) tensorboard->scalar(key, row[key].get<double>(), r.step);
      tensorboard->flush();
    }
    if (talk) {
      std::string text = fmt::format(
          "step {:>5}/{} | loss {:.4f} | lr {:.2e} | norm {:.3f} | {:.0f} tok/s | MFU {:.1f}% | "
          "peak {} (rank {}) | comm dp {} tp {} pp {}{}{}{} | {:.0f} ms",
          r.step, o.steps, r.loss, r.lr, r.grad_norm, r.tokens_per_s, 100 * r.mfu,
          obs::human_bytes(static_cast<double>(r.peak_bytes)), r.worst_rank,
          obs::human_bytes(r.dp_bytes), obs::human_bytes(r.tp_bytes), obs::human_bytes(r.pp_bytes),
          CP > 1 ? " cp " + obs::human_bytes(r.cp_bytes) : "",
          o.ep > 1 ? " ep " + obs::human_bytes(r.ep_bytes) : "",
          P > 1 ? fmt::format(" | bubble {:.0f}%", 100 * r.bubble) : "", 1000 * dt);
      if (moe) text += moe_progress(*moe);
      if (sites)
        text += fmt::format(" | outer {}{}", obs::human_bytes(r.outer_bytes),
                            r.outer_step ? " (outer step)" : "");
      if (row.contains("val_loss"))
        text += fmt::format(" | val loss {:.4f}", row["val_loss"].get<float>());
      if (nonfinite)
        text += fmt::format(" | not finite: update skipped ({} in a row, --skip-nonfinite {})",
                            guard.in_row(), o.skip_nonfinite);
      if (progress.is_terminal() && !row.contains("val_loss") && !nonfinite && r.step % 10 != 0 &&
          r.step != o.steps)
        progress.status(text);
      else
        progress.line(text);
    }
    if (give_up) {
      // More non-finite steps in a row than allowed: every rank stops here, alike.
      const std::string saved =
          newest_saved > 0 ? fmt::format(
                                 "the newest checkpoint, {}/step-{:08}, holds the finite "
                                 "weights of step {}",
                                 o.checkpoint_dir, newest_saved, newest_saved)
          : o.checkpoint_dir.empty() ? std::string("nothing was saved (no --checkpoint-dir)")
                                     : std::string("no checkpoint was saved before it");
      if (lead) {
        if (metrics) metrics->close();
        write_nonfinite_marker(o.checkpoint_dir, start_step, r.step, o);
      }
      {
        std::lock_guard lock(sh.mu);
        sh.nonfinite_stop = true;
      }
      fail_run(
          "step {}: the loss ({}) or the gradient norm ({}) was not finite for {} step(s) in a "
          "row (steps {}-{}), more than --skip-nonfinite {}: the run stops without applying "
          "them; {} (lower --lr, raise --warmup, clip harder with --grad-clip, or check the data)",
          r.step, loss, norm, guard.in_row(), r.step - guard.in_row() + 1, r.step, o.skip_nonfinite,
          saved);
    }
    if (!o.checkpoint_dir.empty() &&
        ((o.checkpoint_every > 0 && r.step % o.checkpoint_every == 0) || r.step == o.steps ||
         r.step == o.stop_after || stop_asked)) {
      ckpt::save(o, groups, rep, r.step, talk, guard.in_row());
      newest_saved = r.step;
      if (lead) clear_nonfinite_marker(o.checkpoint_dir);
    }
    ckpt::maybe_fault("step", r.step, world.rank());
    if (r.step == o.stop_after) {
      stopped_early = true;
      if (talk)
        progress.line(
            fmt::format("stopped after step {} of {} (--stop-after): {}/step-{:08} saved; "
                        "--resume goes on from it",
                        r.step, o.steps, o.checkpoint_dir, r.step));
      break;
    }
    if (stop_asked && r.step < o.steps) {
      // A signal: every rank saw the flag in this step's all-reduce and stops after it.
      stopped_at = r.step;
      stopped_early = true;
      break;
    }
  }
  if (metrics) metrics->close();  // every row on disk, or an error now
  rec.allocations_after_first_step = tracker.snapshot().allocations - allocations_after_step1;
  rec.memory = tracker.snapshot();

  // Peak memory by category of the worst rank, named by its mesh coordinates.
  {
    const RankPeaks peaks = gather_rank_peaks(scalars, rec.memory);
    if (talk) progress.line(peak_memory_line(peaks, mesh.shape(), o.ep > 1, CP > 1));
  }
  if (stage) {
    st.held_peak = stage->held_peak();
    st.pool_buffers = stage->pool_buffers();
    st.buffer_bytes = stage->buffer_bytes();
    st.activation_peak_bytes = rec.memory.peak_of(mem::Category::kActivations);
    if (!o.pipeline.trace.empty()) {
      write_pipeline_trace(world, p + P * d, trace, o.pipeline.trace);
      if (talk) progress.line(fmt::format("wrote the pipeline trace to {}", o.pipeline.trace));
    }
  }

  // On several hosts: what the flight recorders counted on the groups that span hosts.
  if (hosts.hosts() > 1 && scalars) {
    const std::string line = bytes_across_hosts_line(
        {{"tp", &tp_group}, {"cp", &cpg}, {"ep", &epg}, {"pp", &ppg}, {"dp", &grads_group}},
        mesh.shape(), hosts, *scalars);
    if (talk) progress.line(line);
  }

  if (o.profile && talk) {
    double total = 0;
    for (const auto& [name, e] : profile::entries()) total += e.time_s;
    const int64_t profiled = o.steps - start_step > 1 ? o.steps - start_step - 1 : 1;
    progress.line(fmt::format(
        "profile of rank 0 (pp {} dp {} tp {}; each rank times its own kernels) over {} "
        "training step(s){} (time in each kind of kernel):",
        p, d, tp_group.rank(), profiled,
        profiled < o.steps - start_step ? ", the first left out" : ""));
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
    rec.final_params.resize(static_cast<size_t>(rep.gpt.params().numel()));
    device::copy(rec.final_params.data(), mem::Device::kCpu, rep.full_values(), device::current(),
                 rep.gpt.params().numel() * static_cast<int64_t>(sizeof(float)));
  }
  if (!o.export_path.empty() && !stopped_early) {  // a stopped run has not finished
    std::unique_ptr<model::Gpt> whole;
    if (o.tp > 1 || P > 1 || o.ep > 1)
      whole = gather_whole_model(rep, tp_group, ppg, o, sh.schedule, sh.partition);
    if (lead && device::on_cuda()) whole = host_copy(rep.gpt, o);  // export reads the host
    if (lead) {
      export_hf_safetensors(whole ? *whole : rep.gpt, o.export_path);
      if (!o.quiet) progress.line(fmt::format("exported weights to {}", o.export_path));
    }
  }

  std::lock_guard lock(sh.mu);
  TrainResult& res = sh.result;
  if (res.ranks.size() < static_cast<size_t>(world.size()))
    res.ranks.resize(static_cast<size_t>(world.size()));
  if (stage) {
    if (res.pipeline.size() < static_cast<size_t>(world.size()))
      res.pipeline.resize(static_cast<size_t>(world.size()));
    res.pipeline[static_cast<size_t>(world.rank())] = st;
  }
  res.allocations_after_first_step =
      std::max(res.allocations_after_first_step, rec.allocations_after_first_step);
  if (lead) {
    res.steps = std::move(steps);
    res.val_losses = std::move(val_losses);
    res.padded_params = rep.layout.padded_elems;
    res.start_step = start_step;
    res.gathered_param_elems = rep.values ? rep.values->pool_elems() : 0;
    res.gradient_pool_elems = rep.grads ? rep.grads->pool_elems() : 0;
    res.bf16_param_elems = rep.bf16_param_elems();
    if (o.keep_final_params) res.final_params = rec.final_params;
    res.skipped_steps = guard.skipped_total();
  }
  if (stopped_at > 0) {  // (every rank of this process stopped after the same step)
    const int signo = StopSignals::requested();
    res.stop_signal = signo != 0 ? signo : -1;
    if (lead)
      res.stop_message = fmt::format(
          "stopped by {} after step {} of {}: {}", signo != 0 ? signal_name(signo) : "a signal",
          stopped_at, o.steps,
          o.checkpoint_dir.empty()
              ? std::string("nothing saved (no --checkpoint-dir)")
              : fmt::format("checkpoint {}/step-{:08} saved; the same command with --resume auto "
                            "goes on from it",
                            o.checkpoint_dir, stopped_at));
  }
  res.ranks[static_cast<size_t>(world.rank())] = std::move(rec);
}

}  // namespace

void refuse_local_backend_under_mpirun() {
  // mpirun starts one process per rank; the local backend would make each of them a whole
  // job of rank threads, all writing the same checkpoints and files.
  if (comm::mpi_env_world_size() > 1)
    fail(
        "--backend local under mpirun: each of the {} processes would run the whole job by "
        "itself (use --backend mpi or auto under mpirun, or run without mpirun for rank threads)",
        comm::mpi_env_world_size());
}

TrainResult run_training(const TrainOptions& o) {
  o.validate();
  comm::LaunchOptions lo;
  lo.backend = comm::parse_backend(o.backend);
  const comm::BackendKind kind = comm::resolve_backend(lo);
  lo.world_size = o.world_size();  // (under mpirun: checked against -np below)
  lo.timeout_s = o.comm_timeout_s;
  lo.threads_per_rank = rank_threads(o, kind);
  // (A program may run a 1-rank local reference under mpirun on purpose: the tests' oracle.)
  if (kind == comm::BackendKind::kLocal && o.world_size() > 1) refuse_local_backend_under_mpirun();
  const int world = comm::launch_world_size(lo);
  if (world != o.world_size())
    fail(
        "mpirun started {} processes but --pp {} x --dp {}{} x --tp {} is {} (run mpirun -np {}, "
        "or leave --dp out: train takes dp = processes / (tp x pp{}))",
        world, o.pipeline.pp, o.dp, o.cp > 1 ? fmt::format(" x --cp {}", o.cp) : "", o.tp,
        o.world_size(), o.world_size(), o.cp > 1 ? " x cp" : "");
  // The pipeline schedule (verified: complete and deadlock-free) and the layer split.
  std::unique_ptr<parallel::pp::Schedule> sched;
  std::unique_ptr<parallel::pp::Partition> part;
  if (o.pipeline.pp > 1) {
    const PipelineOptions& po = o.pipeline;
    // NCCL's send waits for its receive: there the per-action lists of the interleaved
    // schedule can hang, Megatron-LM's batched exchanges cannot (docs/pipeline.md).
    const bool batched =
        po.exchanges == "batched" || (po.exchanges == "auto" && kind == comm::BackendKind::kNccl);
    if (!batched && kind == comm::BackendKind::kNccl &&
        parallel::pp::parse_schedule_kind(po.schedule) ==
            parallel::pp::ScheduleKind::kInterleaved1F1B)
      fmt::print(stderr,
                 "warning: --pp-exchanges per-action with --backend nccl: the interleaved "
                 "schedule's per-action sends and receives can hang on NCCL once messages "
                 "exceed its buffers (use --pp-exchanges auto)\n");
    sched = std::make_unique<parallel::pp::Schedule>(parallel::pp::build_schedule(
        parallel::pp::parse_schedule_kind(po.schedule), po.pp, o.microbatch_count(),
        po.virtual_stages,
        batched ? parallel::pp::Lowering::kBatched : parallel::pp::Lowering::kPerAction));
    parallel::pp::verify_or_throw(*sched);
    part = std::make_unique<parallel::pp::Partition>(make_partition(o, sched->num_chunks()));
  }
  // Rank 0 writes these (on its own node: another node need not have the folder); every
  // process writes its checkpoint shards.
  // What the weights take on disk at 4 bytes each, without the vocabulary padding (what an
  // export holds; a checkpoint holds three such arrays): the free space there must be at
  // least that.
  double weight_bytes = 0;
  for (const model::ParamSpec& s : model::gpt_param_specs(o.model))
    weight_bytes +=
        4.0 * static_cast<double>(s.real_rows >= 0 ? s.real_rows * shape_numel(s.shape) / s.shape[0]
                                                   : shape_numel(s.shape));
  if (comm::mpi_env_world_rank() == 0) {
    check_output_file(o.metrics, "--metrics");
    check_output_dir(o.tensorboard, "--tensorboard");
    // --export DIR (no .safetensors suffix): a folder for model.safetensors + config.json.
    if (!o.export_path.empty() && export_weights_file(o.export_path) != o.export_path)
      check_export_folder(o.export_path);
    else
      check_output_file(o.export_path, "--export");
    check_free_space(o.export_path.empty() ? "" : export_weights_file(o.export_path), weight_bytes,
                     "--export", "the exported weights");
    check_output_file(o.pipeline.trace, "--trace");
  }
  check_output_dir(o.checkpoint_dir, "--checkpoint-dir");
  check_free_space(o.checkpoint_dir, 3 * weight_bytes, "--checkpoint-dir",
                   "a checkpoint's master weights and AdamW moments");
  const Splits data = make_splits(o);  // read-only, shared by the rank threads
  std::unique_ptr<const HfWeights> init;
  if (!o.init_from.empty()) init = read_init_weights(o);
  // --max-restarts (local backend; under mpirun a supervisor restarts the job): a run that
  // fails (a dead rank, a timeout) starts again from the newest checkpoint.
  TrainOptions run = o;
  for (int attempt = 0;; ++attempt) {
    const int threads = rank_threads(o, kind);
    Shared sh{run, data, init.get(), threads, sched.get(), part.get(), {}, {}};
    try {
      comm::launch(lo, [&](comm::Group& w) { run_rank(sh, w); });
    } catch (const Error& e) {
      if (sh.nonfinite_stop && e.code() == ExitCode::kRunFailure && o.max_restarts > 0)
        throw Error(fmt::format("{}\nnot restarting (--max-restarts): from the newest "
                                "checkpoint, with the same settings, the run would repeat the "
                                "same steps",
                                e.what()),
                    e.code());
      if (e.code() != ExitCode::kRunFailure || attempt >= o.max_restarts ||
          kind == comm::BackendKind::kMpi)
        throw;
      fmt::print(stderr,
                 "error: {}\nrestarting from the newest checkpoint in {} (restart {} of {})\n",
                 e.what(), o.checkpoint_dir, attempt + 1, o.max_restarts);
      run.resume = "auto";
      continue;
    }
    sh.result.restarts = attempt;
    return std::move(sh.result);
  }
}

}  // namespace mt::train

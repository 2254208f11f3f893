// `meshtrain simulate`: one layout, given with the flags of `train`, shown in detail: memory
// per GPU by category, where the step's time goes, and the per-rank timeline of the replayed
// pipeline schedule as a Chrome trace (--trace FILE; chrome://tracing or ui.perfetto.dev).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/plan_flags.h"
#include "core/error.h"
#include "core/write_file.h"
#include "parallel/pipeline/partition.h"
#include "plan/explain.h"

namespace mt::cli {

namespace {

plan::Layout layout_of(const PlanFlags& f, const plan::Job& j, plan::Software software) {
  plan::Layout l;
  l.tp = f.tp.value_or(1);
  l.pp = f.pp.value_or(1);
  l.cp = f.cp.value_or(1);
  l.ep = f.ep.value_or(1);
  l.etp = f.etp.value_or(0);
  const int64_t model_ranks = int64_t(l.tp) * l.pp * l.cp;
  if (!f.dp && j.gpus % model_ranks != 0)
    fail("--gpus {} is not divisible by tp {} x pp {} x cp {}", j.gpus, l.tp, l.pp, l.cp);
  l.dp = f.dp.value_or(static_cast<int>(j.gpus / model_ranks));
  l.zero = f.zero.value_or(0);
  l.virtual_stages = f.virtual_stages.value_or(1);
  l.schedule = f.schedule.value_or(l.virtual_stages > 1 ? "interleaved" : "1f1b");
  l.recompute = plan::parse_recompute(f.recompute.value_or("none"));
  l.sp = f.sp;
  l.microbatch = f.microbatch.value_or(std::max<int64_t>(1, j.batch / l.dp));
  // As train: a pipeline without --microbatch or --microbatches runs --pp microbatches.
  std::optional<int64_t> microbatches = f.microbatches;
  if (!microbatches && l.pp > 1 && !f.microbatch) microbatches = l.pp;
  if (microbatches) {
    if (*microbatches < 1 || j.batch % (int64_t(l.dp) * *microbatches) != 0)
      fail("--microbatches {}{} does not divide --batch {} over dp {}", *microbatches,
           f.microbatches ? "" : " (the default: --pp)", j.batch, l.dp);
    l.microbatch = j.batch / (int64_t(l.dp) * *microbatches);
    if (f.microbatch && *f.microbatch != l.microbatch)
      fail(
          "--microbatch {} contradicts --microbatches {}: batch {} over dp {} in {} microbatches "
          "makes --microbatch {} (give one of the two)",
          *f.microbatch, *f.microbatches, j.batch, l.dp, *f.microbatches, l.microbatch);
  }
  plan::set_software(l,
                     software);  // Megatron-LM 2021 (Narayanan et al.), DeepSpeed 2021 or today's
  l.tp_comm_overlap = f.tp_comm_overlap;
  l.tp_across_nodes = f.tp_across_hosts;
  if (f.unfused_attention) l.fused_attention = false;
  l.cp_comm = f.cp_comm;
  if (f.unfused_grad_accum) l.grad_accum_fusion = false;
  if (f.pp_layers) l.pp_layers = parallel::pp::parse_layer_counts(*f.pp_layers);
  return l;
}

nlohmann::json chrome_trace(const plan::Estimate& e) {
  nlohmann::json events = nlohmann::json::array();
  for (size_t r = 0; r < e.replay.spans.size(); ++r) {
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", 0},
                      {"tid", r},
                      {"args", {{"name", fmt::format("pp rank {}", r)}}}});
    for (const auto& s : e.replay.spans[r]) {
      const bool fwd = s.action.kind == plan::PipeKind::kForward;
      events.push_back(
          {{"name", parallel::pp::format_action(s.action)},
           {"cat", fwd ? "forward" : "backward"},
           {"ph", "X"},
           {"pid", 0},
           {"tid", r},
           {"ts", s.start_s * 1e6},
           {"dur", (s.end_s - s.start_s) * 1e6},
           {"args", {{"microbatch", s.action.microbatch}, {"chunk", s.action.chunk}}}});
    }
    // Blocking exchanges (NCCL's rendezvous): the rank waits here for its neighbours, then
    // for the transfers.
    if (r < e.replay.exchanges.size())
      for (const auto& x : e.replay.exchanges[r]) {
        std::string name = "p2p";
        for (const auto& a : x.messages) name += fmt::format(" {}", parallel::pp::format_action(a));
        events.push_back({{"name", name},
                          {"cat", "p2p"},
                          {"ph", "X"},
                          {"pid", 0},
                          {"tid", r},
                          {"ts", x.start_s * 1e6},
                          {"dur", (x.end_s - x.start_s) * 1e6}});
      }
    // After the pipeline, one after another: what the step adds to the makespan.
    double t = e.pipeline_s;
    auto then = [&](const char* name, const char* cat, double dur_s) {
      events.push_back({{"name", name},
                        {"cat", cat},
                        {"ph", "X"},
                        {"pid", 0},
                        {"tid", r},
                        {"ts", t * 1e6},
                        {"dur", dur_s * 1e6}});
      t += dur_s;
    };
    // Only the end stages take part in the tied embedding's all-reduce.
    if (e.embedding_sync_s > 0 && (r == 0 || r + 1 == e.replay.spans.size()))
      then("tied embedding gradient all-reduce (first and last stage)", "comm", e.embedding_sync_s);
    if (e.dp_exposed_s > 0) then("dp gradient reduction (exposed)", "comm", e.dp_exposed_s);
    then("optimizer", "optimizer", e.optimizer_s);
  }
  return {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
}

void run_simulate(const PlanFlags& f, const std::optional<std::string>& trace, bool megatron_2021,
                  bool deepspeed_2021, bool explain) {
  // DeepSpeed 2021: 2021's Megatron-LM switches, with DeepSpeed's ZeRO (so not
  // --megatron-2021's refusal of it).
  f.check(megatron_2021);
  const plan::Job j = f.job();
  f.check_pins(j, /*search=*/false);
  const plan::Software software = deepspeed_2021  ? plan::Software::kDeepSpeed2021
                                  : megatron_2021 ? plan::Software::kMegatron2021
                                                  : plan::Software::kToday;
  const plan::Layout l = layout_of(f, j, software);
  const plan::Estimate e = plan::estimate(j, l, true);
  FILE* human = f.json ? stderr : stdout;
  const auto& m = e.memory;
  std::string text =
      fmt::format("simulate: {} ({} parameters) on {} x {} ({}), batch {} x seq {}, {}\n",
                  j.model.name, params_text(j.model.total_params()), j.gpus, j.cluster.gpu.name,
                  j.cluster.name, j.batch, j.seq, j.dtype);
  text += estimate_table({e});
  auto yes = [](bool b) { return b ? "yes" : "no"; };
  const plan::Layout& sw = e.layout;  // the switches as they take effect (plan::as_run)
  text += fmt::format(
      "software: {} (DP reduction overlapped {}, backward TP beside weight gradients {}, "
      "userbuffers TP overlap {}, p2p overlapped {}, fused attention {}, gradient "
      "accumulation in the GEMMs {})\n",
      deepspeed_2021              ? "DeepSpeed 2021 on Megatron-LM 2021"
      : megatron_2021             ? "Megatron-LM 2021"
      : plan::runs_our_runtime(j) ? "meshtrain's runtime"
                                  : "today's Megatron-Core",
      yes(sw.dp_overlap), yes(sw.tp_overlap), yes(sw.tp_comm_overlap), yes(sw.pp_overlap),
      yes(sw.fused_attention), yes(sw.grad_accum_fusion));
  if (sw.zero >= 3 && sw.z3_bytes_per_s > 0)
    text += fmt::format(
        "ZeRO-3: every collective at {:.1f} GB/s per GPU, the next module's gather beside this "
        "one's compute; under full recomputation {:.0f}% of the parameters gathered again "
        "(DeepSpeed 2021's, docs/planner.md)\n",
        sw.z3_bytes_per_s / 1e9,
        100 * (sw.recompute == plan::Recompute::kFull ? plan::regathered_fraction(j, sw) : 0.0));
  if (l.pp > 1)
    text += fmt::format(
        "layers per pipeline chunk: {}{}\n", fmt::join(plan::chunk_layers(j, l), ","),
        l.pp_layers.empty()
            ? (l.even_layers ? " (even split)" : " (balanced by cost, as train splits them)")
            : " (--pp-layers)");
  // In units that suit the numbers (a tiny model's are kB and MB, not 0.000 GB).
  const auto b = [](double bytes) {
    const auto [unit, scale] = bytes >= 1e9   ? std::pair{"GB", 1e9}
                               : bytes >= 1e6 ? std::pair{"MB", 1e6}
                                              : std::pair{"kB", 1e3};
    return fmt::format("{:.4g} {}", bytes / scale, unit);
  };
  text += fmt::format(
      "memory per GPU (worst: pp rank {}, {} microbatch-chunks in flight):\n"
      "  parameters {}, gradients {}, optimizer {}, activations {}, communication {}; at the "
      "optimizer step (activations freed) fp32 gradients {}: peak {} of {}{}\n",
      e.worst_stage, e.in_flight, b(m.parameters), b(m.gradients), b(m.optimizer), b(m.activations),
      b(m.communication), b(m.step_gradients_f32), b(m.total()), b(plan::memory_per_rank(j)),
      m.total() > plan::memory_per_rank(j) ? "  (DOES NOT FIT)" : "");
  text += fmt::format(
      "time per step: {:.4g} s = pipeline {:.4g} s (bubble {:.1f}%) + tied embedding sync "
      "{:.4g} s + exposed dp {:.4g} s + optimizer {:.4g} s\n"
      "  busiest rank (pp rank {}): forward {:.4g} s, backward (+recompute) {:.4g} s, of which tp "
      "comm {:.4g} s, cp comm {:.4g} s; gradient accumulation adds {:.4g} s; p2p {:.4g} s; dp "
      "comm {:.4g} s ({} hidden)\n"
      "  {:.4g} tokens/s, {:.3g} model TFLOP/s per GPU, {:.3g} with recomputation, MFU {:.1f}%\n",
      e.step_time_s, e.pipeline_s, 100 * e.bubble_fraction, e.embedding_sync_s, e.dp_exposed_s,
      e.optimizer_s, e.busiest_rank, e.forward_s, e.backward_s, e.tp_comm_s, e.cp_comm_s,
      e.grad_accum_s, e.pp_comm_s, e.dp_comm_s,
      e.dp_exposed_s <= 0 ? "all" : (e.dp_exposed_s < e.dp_comm_s ? "partly" : "not"),
      e.tokens_per_s, e.tflops_per_gpu, e.hw_tflops_per_gpu, 100 * e.mfu);
  std::fprintf(human, "%s", text.c_str());
  std::vector<plan::StepItem> items;
  if (explain) {
    items = plan::explain(j, e);
    std::fprintf(human, "%s",
                 fmt::format("the step as a stacked list (busiest pipeline rank {}):\n{}",
                             e.busiest_rank, plan::explain_text(items, e.step_time_s))
                     .c_str());
  }
  if (trace) {
    io::write_file(*trace, chrome_trace(e).dump() + "\n");  // checked: a full disk is an error
    std::fprintf(human, "wrote %s (chrome://tracing)\n", trace->c_str());
  }
  if (f.json) {
    nlohmann::json out = {{"job", job_json(j)}, {"layouts", {estimate_json(j, e)}}};
    if (explain) {
      out["explain"] = nlohmann::json::array();
      for (const plan::StepItem& it : items)
        out["explain"].push_back({{"name", it.name}, {"seconds", it.seconds}});
    }
    std::printf("%s\n", out.dump(2).c_str());
  }
}

}  // namespace

void register_simulate(CLI::App& app) {
  auto f = std::make_shared<PlanFlags>();
  auto trace = std::make_shared<std::optional<std::string>>();
  CLI::App* cmd = app.add_subcommand(
      "simulate", "one layout in detail: memory by category, step time, per-rank timeline");
  f->add_to(*cmd);
  auto megatron_2021 = std::make_shared<bool>(false);
  cmd->add_option("--trace", *trace, "write the per-rank timeline as a Chrome trace (JSON)");
  cmd->add_flag("--megatron-2021", *megatron_2021,
                "as Megatron-LM ran in 2021 (Narayanan et al.): no comm overlap of the DP "
                "reduction when pipelining nor of backward's TP all-reduces; layers split evenly");
  auto deepspeed_2021 = std::make_shared<bool>(false);
  cmd->add_flag("--deepspeed-2021", *deepspeed_2021,
                "as DeepSpeed's ZeRO-3 ran in 2021 on Megatron-LM 2021 (Narayanan et al. Table 2): "
                "--megatron-2021, and ZeRO-3's collectives at 19.0 GB/s per GPU, a module's "
                "parameters gathered again after the recompute when reused 1e9 parameters later");
  auto explain = std::make_shared<bool>(false);
  cmd->add_flag("--explain", *explain,
                "the step as a stacked list: GEMMs by kind, attention, memory-bound kernels, "
                "each exposed communication, bubble, optimizer (JSON: \"explain\")");
  cmd->callback([f, trace, megatron_2021, deepspeed_2021, explain] {
    run_simulate(*f, *trace, *megatron_2021, *deepspeed_2021, *explain);
  });
}

}  // namespace mt::cli

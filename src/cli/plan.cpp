// `meshtrain plan`: searches every valid layout of a model on a cluster and prints the best,
// why the rest were dropped, and (--emit-config) a run config that `meshtrain train` accepts.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/plan_flags.h"
#include "cli/plan_sites.h"
#include "core/error.h"
#include "core/write_file.h"
#include "model/config.h"
#include "obs/report.h"
#include "parallel/pipeline/partition.h"
#include "plan/explain.h"
#include "plan/moe.h"

namespace mt::cli {

void PlanFlags::add_to(CLI::App& app) {
  model.add_to(app);
  // train's help lists the presets train can build; the planner has the published ones too.
  app.get_option("--model")->description(
      fmt::format("preset (default tiny): {}", fmt::join(plan::model_preset_names(), ", ")));
  // Unlike train (4 x d_model), the planner keeps a preset's MLP ratio: llama3-8b's 14336 /
  // 4096 stays 3.5 at any --d-model.
  app.get_option("--d-ff")->description(
      "MLP width (default: the preset's d_ff, scaled with --d-model by the preset's d_ff / "
      "d_model ratio)");
  app.add_option("--cluster", cluster,
                 "dgx-a100, dgx-h100 (default), dgx-h100-measured, hgx-b200, this-host (meshtrain "
                 "calibrate) or a JSON file");
  app.add_option("--gpus", gpus, "GPUs (ranks) in the job")->required();
  app.add_option("--batch", batch, "global batch, in sequences (default: --gpus)");
  app.add_option("--dtype", dtype, "bf16 or fp16 (mixed precision), f32 (our CPU runtime)")
      ->check(CLI::IsMember({"bf16", "fp16", "f32"}));
  app.add_option("--dp", dp, "data-parallel ranks");
  app.add_option("--tp", tp, "tensor-parallel ranks (within a node)");
  app.add_option("--pp", pp, "pipeline stages");
  app.add_option("--cp", cp, "context-parallel ranks (pinned, default 1)");
  app.add_option("--cp-comm", cp_comm,
                 "how the cp ranks get the keys and values, as train runs it: ring (default; "
                 "overlapped with the attention), all-gather or a2a (Ulysses)")
      ->check(CLI::IsMember({"ring", "all-gather", "a2a"}));
  app.add_option("--ep", ep,
                 "expert-parallel ranks (MoE models; carved from dp x cp: experts split over ep, "
                 "their gradients reduced over dp x cp / ep)");
  app.add_option(
      "--etp", etp,
      "MoE under Megatron-Core: the experts split over the tp ranks (--etp equal to "
      "--tp, its default; the routed rows gathered and scattered over tp) or whole on "
      "each (--etp 1; their gradients reduced over tp x dp x cp / ep); plan: both tried");
  app.add_option("--expert-load", expert_load,
                 "MoE: the busiest expert's load over the mean (default 1, balanced); scales the "
                 "experts' compute and all-to-all bytes under --ep");
  app.add_option("--zero", zero, "ZeRO stage 0..3");
  app.add_flag("--sp", sp, "sequence parallelism in the tp group");
  app.add_flag("--no-sp", no_sp, "no sequence parallelism (plan: pins it off)");
  app.add_flag("--tp-comm-overlap", tp_comm_overlap,
               "overlap every TP collective with its GEMM (Transformer Engine userbuffers, "
               "Megatron-Core --tp-comm-overlap; needs --sp; plan: on the SP layouts)");
  app.add_flag("--tp-across-hosts", tp_across_hosts,
               "tp across nodes (hosts), dp inside them: train's --mesh-order pp,tp,cp,dp");
  app.add_flag("--unfused-attention", unfused_attention,
               "attention as separate softmax (+ dropout) kernels that keep the T x T "
               "probabilities (Megatron-LM 2021/2022, our CUDA backend by default) instead of "
               "one fused kernel");
  app.add_flag("--unfused-grad-accum", unfused_grad_accum,
               "weight gradients written to a temporary and added into the accumulation buffer "
               "by a separate kernel every microbatch (Megatron-LM 2021, PyTorch autograd "
               "accumulation) instead of accumulated by the GEMM");
  app.add_flag("--meshtrain-runtime", meshtrain_runtime,
               "as `meshtrain train` runs the job (no dropout, unfused attention, blocking TP "
               "and pipeline exchanges) rather than Megatron-LM; implied by plan --emit-config, "
               "by f32 and by a shared host");
  app.add_flag("--no-dropout", no_dropout,
               "train without dropout (mixed precision: no masks through HBM nor kept; the "
               "GPT presets have it, the llama3 presets do not, our f32 runtime never)");
  app.add_option("--microbatch", microbatch, "sequences per microbatch");
  app.add_option("--microbatches", microbatches,
                 "microbatches per step and pipeline (instead of --microbatch)");
  app.add_option("--schedule", schedule, "gpipe, 1f1b, interleaved or zb1")
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved", "zb1"}));
  app.add_option("--virtual-stages", virtual_stages, "model chunks per pipeline rank");
  app.add_option("--pp-layers", pp_layers,
                 "layers per pipeline chunk, comma-separated, as train takes it (default: the "
                 "split train makes; plan: only layouts with that many chunks)");
  app.add_option("--recompute", recompute, "none, selective or full")
      ->check(CLI::IsMember({"none", "selective", "full"}));
  app.add_flag("--json", json, "print JSON on stdout (the table goes to stderr)");
}

void PlanFlags::check(bool megatron_2021) const {
  auto at_least = [](const char* flag, const auto& value, int64_t min) {
    if (value && *value < min) fail("{} {} must be at least {}", flag, *value, min);
  };
  at_least("--n-layer", model.n_layer, 1);
  at_least("--n-head", model.n_head, 1);
  at_least("--d-model", model.d_model, 1);
  at_least("--d-ff", model.d_ff, 1);
  at_least("--vocab", model.vocab, 1);
  at_least("--seq", model.seq, 1);
  at_least("--dp", dp, 1);
  at_least("--tp", tp, 1);
  at_least("--pp", pp, 1);
  at_least("--cp", cp, 1);
  at_least("--ep", ep, 1);
  at_least("--etp", etp, 1);
  if (expert_load < 1.0)
    fail("--expert-load {} is below 1 (the busiest expert carries at least the mean load)",
         expert_load);
  at_least("--virtual-stages", virtual_stages, 1);
  at_least("--microbatch", microbatch, 1);
  at_least("--microbatches", microbatches, 1);
  if (zero && (*zero < 0 || *zero > 3))
    fail("--zero {} is not a ZeRO stage (choose 0, 1, 2 or 3)", *zero);
  if (virtual_stages && *virtual_stages > 1 && pp && *pp == 1)
    fail(
        "--virtual-stages {} needs --pp 2 or more (interleaving splits each pipeline rank's "
        "layers into chunks); with --pp 1 drop --virtual-stages",
        *virtual_stages);
  if (schedule == "interleaved" && virtual_stages && *virtual_stages == 1)
    fail(
        "--schedule interleaved needs --virtual-stages 2 or more (it interleaves each pipeline "
        "rank's chunks); with one chunk per rank use --schedule 1f1b");
  if (sp && no_sp) fail("--sp and --no-sp contradict each other");
  if (tp_comm_overlap && no_sp) fail("--tp-comm-overlap needs sequence parallelism: drop --no-sp");
  if (megatron_2021) check_megatron_2021();
}

// --megatron-2021 models only what that software had: a flag for something it lacked is a
// contradiction, not a wish to honour silently (plan would search without it, simulate
// would label it 2021's).
void PlanFlags::check_megatron_2021() const {
  if (zero && *zero > 0)
    fail(
        "--megatron-2021 has no ZeRO (Megatron-LM's distributed optimizer came later): drop "
        "--zero {} or --megatron-2021",
        *zero);
  if (sp || tp_comm_overlap)
    fail(
        "--megatron-2021 has no sequence parallelism (Korthikanti et al. 2022): drop {} or "
        "--megatron-2021",
        sp ? "--sp" : "--tp-comm-overlap");
  if (recompute == "selective")
    fail(
        "--megatron-2021 has no selective recomputation (Korthikanti et al. 2022): use "
        "--recompute none or full, or drop --megatron-2021");
  if (schedule == "zb1")
    fail(
        "--megatron-2021 has no zero-bubble schedule (Qi et al. 2023): use --schedule gpipe, "
        "1f1b or interleaved, or drop --megatron-2021");
  const bool interleaved = schedule == "interleaved" || (virtual_stages && *virtual_stages > 1);
  if (interleaved && pp && *pp <= 2)
    fail(
        "--megatron-2021 interleaves only with more than 2 pipeline stages (\"pipeline-model-"
        "parallel size should be greater than 2 with interleaved schedule\"), not --pp {}: use "
        "--pp 3 or more, drop {}, or drop --megatron-2021",
        *pp, schedule == "interleaved" ? "--schedule interleaved" : "--virtual-stages");
}

// Pins that no layout of the job can honour together, named before any search (plan would
// otherwise report whichever divisibility failed most often). For plan (search) each check
// takes the largest value the other pins leave a dimension; for simulate an unset --tp,
// --pp or --cp is 1 (and --dp what the others leave), as simulate runs it.
void PlanFlags::check_pins(const plan::Job& j, bool search) const {
  const int64_t t = tp.value_or(1), p = pp.value_or(1), c = cp.value_or(1), d = dp.value_or(1);
  // "--gpus 8 with --tp 8 leaves dp x cp 1": the GPUs, the pins that use them, what is left.
  auto leaves = [&](const char* dim, int64_t left) {
    std::string with;
    for (auto [flag, value] : {std::pair{"--dp", dp}, {"--tp", tp}, {"--pp", pp}, {"--cp", cp}})
      if (value) with += fmt::format("{} {} {}", with.empty() ? " with" : " x", flag, *value);
    return fmt::format("--gpus {}{} leaves {} {}", j.gpus, with, dim, left);
  };
  // ZeRO shards the states over the data-parallel ranks (and CP's, which hold the same).
  const int64_t shards = dp ? d * c : j.gpus / (t * p);
  if (zero && *zero > 0 && shards <= 1)
    fail(
        "--zero {} needs more than one data-parallel rank to shard over, but {}: drop --zero "
        "(over one rank it is --zero 0) or leave GPUs for dp",
        *zero, leaves("dp x cp", shards));
  const int64_t max_tp = tp || !search ? t : j.gpus / (d * p * c);
  if (sp && max_tp <= 1)
    fail(
        "--sp splits activations over the tensor-parallel group, but {}: give --tp 2 or more, "
        "or drop --sp",
        leaves("tp", max_tp));
  const int64_t max_pp = pp || !search ? p : j.gpus / (d * t * c);
  if (schedule == "interleaved" && max_pp < 2)
    fail(
        "--schedule interleaved needs a pipeline of 2 or more stages, but {}: give --pp 2 or "
        "more, or use --schedule 1f1b",
        leaves("pp", max_pp));
  // As train refuses it (and plan::invalid_reason): with a pipeline, zb1's W pass would read
  // activations that full recomputation has reused. Without one the schedule does not apply.
  if (schedule == "zb1" && recompute == "full" && max_pp >= 2)
    fail(
        "--schedule zb1 with --recompute full: the W pass needs a block's activations after "
        "later blocks' recomputation reused them (train refuses the pair): use --recompute "
        "selective or none, or another schedule");
}

namespace {

// Grouped-query attention shares each key/value head among n_head / n_kv_head query heads:
// n_kv_head must divide n_head. --n-head on a GQA preset keeps its n_kv_head.
void check_kv_heads(const plan::ModelSpec& m, const std::string& preset) {
  if (m.n_kv_head == m.n_head) return;
  if (m.n_head < m.n_kv_head || m.n_head % m.n_kv_head != 0)
    fail(
        "--n-head {} is not a multiple of {}'s {} key/value heads (grouped-query attention "
        "shares each among n_head / n_kv_head query heads; --n-head keeps the preset's "
        "n_kv_head): use a multiple of {}",
        m.n_head, preset, m.n_kv_head, m.n_kv_head);
}

}  // namespace

plan::Job PlanFlags::job() const {
  plan::Job j;
  const std::string name = model.model.value_or("tiny");
  j.model = plan::model_preset(name);
  plan::ModelSpec& m = j.model;
  bool custom = false;
  auto take = [&](int64_t& field, const std::optional<int64_t>& flag) {
    if (flag && *flag != field) field = *flag, custom = true;
  };
  take(m.n_layer, model.n_layer);
  if (model.n_head && *model.n_head != m.n_head) {
    if (m.n_kv_head == m.n_head) m.n_kv_head = *model.n_head;
    m.n_head = *model.n_head;
    custom = true;
  }
  if (model.d_model && *model.d_model != m.d_model) m.d_ff = m.d_ff * *model.d_model / m.d_model;
  take(m.d_model, model.d_model);
  take(m.d_ff, model.d_ff);
  if (model.vocab && *model.vocab != (m.vocab_real ? m.vocab_real : m.vocab)) {
    m.vocab_real = *model.vocab;
    m.vocab = (*model.vocab + model::kVocabPadMultiple - 1) / model::kVocabPadMultiple *
              model::kVocabPadMultiple;
    custom = true;
  }
  take(m.seq, model.seq);
  if (model.no_bias && m.bias) m.bias = false, custom = true;
  if (model.untied && m.tied) m.tied = false, custom = true;
  if (no_dropout && m.dropout) m.dropout = false, custom = true;
  // Mixture of experts (train's --moe-* flags): the preset's experts (an engine preset's
  // MoeConfig), changed by the flags; the MoE blocks counted over this n_layer.
  const std::vector<std::string> engine = model::preset_names();
  model::MoeConfig moe;
  if (std::find(engine.begin(), engine.end(), name) != engine.end()) moe = model::preset(name).moe;
  const bool moe_flags = model.moe_experts || model.moe_top_k || model.moe_every || model.moe_ff ||
                         model.moe_shared_ff;
  if (model.moe_experts) moe.n_experts = *model.moe_experts;
  if (model.moe_top_k) moe.top_k = *model.moe_top_k;
  if (model.moe_every) moe.every = *model.moe_every;
  if (model.moe_ff) moe.d_ff_expert = *model.moe_ff;
  if (model.moe_shared_ff) moe.d_ff_shared = *model.moe_shared_ff;
  if (moe_flags) {
    if (moe.n_experts < 0 || moe.top_k < 1 || moe.every < 1 || moe.d_ff_expert < 0 ||
        moe.d_ff_shared < 0 || (moe.enabled() && moe.top_k > moe.n_experts))
      fail(
          "MoE flags out of range (--moe-experts {} at least 0, --moe-top-k {} from 1 to the "
          "experts, --moe-every {} at least 1, --moe-ff {} and --moe-shared-ff {} at least 0)",
          moe.n_experts, moe.top_k, moe.every, moe.d_ff_expert, moe.d_ff_shared);
    custom = true;
  }
  if (moe.enabled()) {
    m.n_experts = moe.n_experts;
    m.top_k = moe.top_k;
    m.d_ff_expert = moe.d_ff_expert > 0 ? moe.d_ff_expert : m.d_ff;
    m.d_ff_shared = moe.d_ff_shared;
    m.moe_layers = 0;
    for (int64_t i = 0; i < m.n_layer; ++i) m.moe_layers += moe.is_moe_layer(i);
  } else {
    m.n_experts = m.top_k = m.d_ff_expert = m.d_ff_shared = m.moe_layers = 0;
  }
  if (custom) m.name = name + " (modified)";
  if (m.n_layer < 1 || m.n_head < 1 || m.d_model < 1 || m.d_ff < 1 || m.vocab < 1 || m.seq < 1)
    fail(
        "model shape must be positive (n_layer {}, n_head {}, d_model {}, d_ff {}, vocab {}, "
        "seq {})",
        m.n_layer, m.n_head, m.d_model, m.d_ff, m.vocab, m.seq);
  if (m.d_model % m.n_head != 0)
    fail("--d-model {} is not divisible by --n-head {}", m.d_model, m.n_head);
  check_kv_heads(m, name);
  j.cluster = plan::cluster_preset(cluster);
  j.gpus = *gpus;
  if (j.gpus < 1) fail("--gpus {} must be at least 1", j.gpus);
  if (j.cluster.max_nodes > 0 && j.gpus > j.cluster.max_nodes * int64_t(j.cluster.gpus_per_node))
    fail("--gpus {} exceeds cluster '{}' ({} nodes of {})", j.gpus, j.cluster.name,
         j.cluster.max_nodes, j.cluster.gpus_per_node);
  j.seq = m.seq;
  j.batch = batch.value_or(j.gpus);
  if (j.batch < 1) fail("--batch {} must be at least 1", j.batch);
  j.dtype = dtype;
  j.our_runtime = meshtrain_runtime;
  j.expert_load = expert_load;
  return j;
}

plan::SearchPins PlanFlags::pins() const {
  plan::SearchPins p;
  p.dp = dp, p.tp = tp, p.pp = pp, p.cp = cp, p.ep = ep, p.zero = zero;
  p.etp = etp;
  p.virtual_stages = virtual_stages;
  p.microbatch = microbatch;
  if (microbatches) {
    if (!dp) fail("--microbatches needs --dp (or give --microbatch, the size)");
    if (*microbatches < 1 || batch.value_or(*gpus) % (int64_t(*dp) * *microbatches) != 0)
      fail("--microbatches {} does not divide the batch over --dp {}", *microbatches, *dp);
    p.microbatch = batch.value_or(*gpus) / (int64_t(*dp) * *microbatches);
    if (microbatch && *microbatch != *p.microbatch)
      fail(
          "--microbatch {} contradicts --microbatches {}: batch {} over --dp {} in {} "
          "microbatches makes --microbatch {} (give one of the two)",
          *microbatch, *microbatches, batch.value_or(*gpus), *dp, *microbatches, *p.microbatch);
  }
  p.schedule = schedule;
  p.cp_comm = cp_comm;
  if (pp_layers) p.pp_layers = parallel::pp::parse_layer_counts(*pp_layers);
  if (recompute) p.recompute = plan::parse_recompute(*recompute);
  if (sp) p.sp = true;
  if (no_sp) p.sp = false;
  p.tp_comm_overlap = tp_comm_overlap;
  p.tp_across_nodes = tp_across_hosts;
  if (unfused_attention) p.fused_attention = false;
  if (unfused_grad_accum) p.grad_accum_fusion = false;
  return p;
}

bool PlanFlags::pins_any() const {
  return dp || tp || pp || cp || ep || zero || virtual_stages || microbatch || microbatches ||
         schedule || recompute || pp_layers || sp || no_sp;
}

nlohmann::json job_json(const plan::Job& j) {
  const plan::ModelSpec& m = j.model;
  return {{"model",
           {{"name", m.name},
            {"n_layer", m.n_layer},
            {"n_head", m.n_head},
            {"n_kv_head", m.n_kv_head},
            {"d_model", m.d_model},
            {"d_ff", m.d_ff},
            {"vocab", m.vocab},
            {"seq", j.seq},
            {"params", m.total_params()},
            {"active_params", m.active_params()},
            {"n_experts", m.n_experts},
            {"top_k", m.top_k}}},
          {"expert_load", j.expert_load},
          {"cluster", j.cluster.name},
          {"gpu", j.cluster.gpu.name},
          {"gpus", j.gpus},
          {"batch", j.batch},
          {"dtype", j.dtype}};
}

std::string params_text(double n) {
  if (n >= 1e12) return fmt::format("{:.3g}T", n / 1e12);
  if (n >= 1e9) return fmt::format("{:.3g}B", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.3g}M", n / 1e6);
  return fmt::format("{:.3g}K", n / 1e3);
}

nlohmann::json estimate_json(const plan::Job& j, const plan::Estimate& e) {
  const plan::Layout& l = e.layout;
  const plan::MemoryBytes& m = e.memory;
  return {{"dp", l.dp},
          {"tp", l.tp},
          {"pp", l.pp},
          {"cp", l.cp},
          {"cp_comm", l.cp_comm},
          {"ep", l.ep},
          {"etp", plan::moe_expert_tp(j, l)},
          {"virtual_stages", l.virtual_stages},
          {"pp_layers", plan::chunk_layers(j, l)},
          {"microbatch", l.microbatch},
          {"microbatches", e.microbatches},
          {"zero", l.zero},
          {"recompute", plan::recompute_name(l.recompute)},
          {"sp", l.sp},
          {"schedule", l.schedule},
          {"tp_across_nodes", l.tp_across_nodes},
          {"software",
           {{"dp_overlap", l.dp_overlap},  // as they take effect (plan::as_run)
            {"tp_overlap", l.tp_overlap},
            {"tp_comm_overlap", l.tp_comm_overlap},
            {"pp_overlap", l.pp_overlap},
            {"fused_attention", l.fused_attention},
            {"grad_accum_fusion", l.grad_accum_fusion},
            {"torch_ddp", l.torch_ddp},
            {"even_layers", l.even_layers}}},
          {"step_time_s", e.step_time_s},
          {"tokens_per_s", e.tokens_per_s},
          {"tflops_per_gpu", e.tflops_per_gpu},
          {"hw_tflops_per_gpu", e.hw_tflops_per_gpu},
          {"mfu", e.mfu},
          {"bubble_fraction", e.bubble_fraction},
          {"memory_bytes_per_gpu",
           {{"parameters", m.parameters},
            {"gradients", m.gradients},
            {"optimizer", m.optimizer},
            {"activations", m.activations},
            {"communication", m.communication},
            {"step_gradients_f32", m.step_gradients_f32},
            {"total", m.total()}}},
          // simulate shows a layout over the HBM too (exit 0): this says so for scripts.
          {"hbm_bytes_per_gpu", plan::memory_per_rank(j)},
          {"fits", m.total() <= plan::memory_per_rank(j)},
          {"worst_stage", e.worst_stage},
          {"busiest_rank", e.busiest_rank},
          {"in_flight", e.in_flight},
          {"time_s",
           {{"pipeline", e.pipeline_s},
            {"forward", e.forward_s},
            {"backward", e.backward_s},
            {"tp_comm", e.tp_comm_s},
            {"cp_comm", e.cp_comm_s},
            {"ep_comm", e.ep_comm_s},
            {"moe_tp_comm", e.moe_tp_comm_s},
            {"pp_comm", e.pp_comm_s},
            {"dp_comm", e.dp_comm_s},
            {"dp_exposed", e.dp_exposed_s},
            {"grad_accum", e.grad_accum_s},
            {"embedding_sync", e.embedding_sync_s},
            {"optimizer", e.optimizer_s}}}};
}

std::string estimate_table(const std::vector<plan::Estimate>& rows) {
  // The memory unit of the largest total, so that a tiny model's columns are not all 0.00;
  // TFLOP/s with 3 significant digits (a CPU rank's 0.0231).
  double largest = 0;
  for (const auto& e : rows) largest = std::max(largest, e.memory.total());
  const auto [unit, scale] = largest >= 1e9   ? std::pair{"GB", 1e9}
                             : largest >= 1e6 ? std::pair{"MB", 1e6}
                                              : std::pair{"kB", 1e3};
  std::string out = fmt::format(
      "{:>3} {:>7} {:>3} {:>4} {:>3} {:>4} {:>2} {:>3} {:>4} {:>9} {:>3} {:>9} {:>11} {:>6} "
      "{:>6} {:>6} {:>7} | {:>6} {:>6} {:>6} {:>6} {:>6} {:>7} {:>6} ({} per GPU; total = "
      "params + grads + optim + max(activ + comm, f32grad), f32grad: the optimizer step's fp32 "
      "gradients)\n",
      "#", "dp", "tp", "pp", "cp", "ep", "v", "mb", "zero", "recompute", "sp", "step_s", "tokens/s",
      "TFLOPs", "MFU", "bubble", "sched", "params", "grads", "optim", "activ", "comm", "f32grad",
      "total", unit);
  int i = 0;
  bool any_whole = false;
  for (const auto& e : rows) {
    const auto& l = e.layout;
    const auto& m = e.memory;
    // "w": a MoE layout's experts whole on each tp rank (--etp 1), not split over tp.
    const bool whole = l.etp == 1 && l.tp > 1;
    any_whole = any_whole || whole;
    const std::string ep = fmt::format("{}{}", l.ep, whole ? "w" : "");
    out += fmt::format(
        "{:>3} {:>7} {:>3} {:>4} {:>3} {:>4} {:>2} {:>3} {:>4} {:>9} {:>3} {:>9.4g} {:>11.4g} "
        "{:>6.3g} {:>5.1f}% {:>5.1f}% {:>7} | {:>6.2f} {:>6.2f} {:>6.2f} {:>6.2f} {:>6.2f} "
        "{:>7.2f} {:>6.2f}\n",
        ++i, l.dp, l.tp, l.pp, l.cp, ep, l.virtual_stages, l.microbatch, l.zero,
        plan::recompute_name(l.recompute), l.sp ? "on" : "off", e.step_time_s, e.tokens_per_s,
        e.tflops_per_gpu, 100 * e.mfu, 100 * e.bubble_fraction, l.schedule, m.parameters / scale,
        m.gradients / scale, m.optimizer / scale, m.activations / scale, m.communication / scale,
        m.step_gradients_f32 / scale, m.total() / scale);
  }
  if (any_whole)
    out +=
        "  ep \"Nw\": the experts whole on each tp rank (--etp 1); otherwise Megatron-Core "
        "splits them over tp (--etp = --tp)\n";
  return out;
}

namespace {

// `train` builds GPT-2-style models in f32 or bf16 anywhere, and Llama-family models (the
// engine's presets, unmodified: the config names the preset) on CPUs: a plan of anything
// else would emit a config for a different job. Checked before the search.
void check_trainable(const plan::Job& j, const PlanFlags& f) {
  const plan::ModelSpec& m = j.model;
  std::vector<std::string> lacks;
  if (m.n_kv_head != m.n_head)
    lacks.push_back(fmt::format("grouped-query attention with {} key/value heads", m.n_kv_head));
  if (m.swiglu) lacks.push_back("SwiGLU");
  if (!m.learned_pos) lacks.push_back("rotary positions");
  if (!lacks.empty()) {
    const auto names = model::preset_names();
    const bool engine_preset = f.model.model && m.name == *f.model.model &&
                               std::find(names.begin(), names.end(), *f.model.model) != names.end();
    if (!engine_preset)
      fail(
          "--emit-config: train builds {} ({}) only as one of its presets, unmodified (the "
          "config names it): plan --model {} without shape flags, or drop --emit-config",
          m.name, fmt::join(lacks, ", "),
          m.name == "llama3-405b" ? "llama3.1-405b" : "llama-tiny, llama3.2-1b, ...");
    if (j.cluster.compute_units == 0)
      fail(
          "--emit-config: train runs {} ({}) on CPUs only so far (no CUDA kernels for them "
          "yet); plan it for --cluster this-host, or drop --emit-config",
          m.name, fmt::join(lacks, ", "));
  }
  if (j.dtype != "f32" && j.dtype != "bf16")
    fail("--emit-config: train runs f32 or bf16, not --dtype {}; plan with --dtype bf16 (or f32)",
         j.dtype);
  // train runs context parallelism on CPU ranks only (docs/context_parallel.md).
  if (f.cp && *f.cp > 1 && j.cluster.compute_units == 0)
    fail(
        "--emit-config: train runs context parallelism on the CPU only so far, so it cannot run "
        "--cp {} on GPUs; plan it for --cluster this-host, drop --cp, or drop --emit-config",
        *f.cp);
}

// A run config for `meshtrain train` (only keys its --config accepts) and the flags that
// carry the rest of the layout (the pipeline: pp, microbatches, schedule, virtual stages,
// the layers per chunk).
nlohmann::json train_config(const plan::Job& j, const plan::Estimate& e,
                            const std::optional<std::string>& preset) {
  const plan::Layout& l = e.layout;
  nlohmann::json c;
  if (preset) {
    c["model"] = *preset;
  } else {
    c["n_layer"] = j.model.n_layer;
    c["n_head"] = j.model.n_head;
    c["d_model"] = j.model.d_model;
    c["d_ff"] = j.model.d_ff;
    c["vocab"] = j.model.vocab_real ? j.model.vocab_real : j.model.vocab;
    if (!j.model.bias) c["bias"] = false;
    if (!j.model.tied) c["tied"] = false;
    if (j.model.is_moe()) {  // train's --moe-* fields (every k-th block MoE: k = L / L_moe)
      c["moe_experts"] = j.model.n_experts;
      c["moe_top_k"] = j.model.top_k;
      c["moe_ff"] = j.model.d_ff_expert;
      if (j.model.d_ff_shared > 0) c["moe_shared_ff"] = j.model.d_ff_shared;
      if (j.model.moe_layers < j.model.n_layer)
        c["moe_every"] = j.model.n_layer / j.model.moe_layers;
    }
  }
  c["seq"] = j.seq;
  c["batch"] = j.batch;
  c["microbatch"] = l.microbatch;
  c["dtype"] = j.dtype;
  c["dp"] = l.dp;
  c["tp"] = l.tp;
  c["sp"] = l.sp;
  if (l.cp > 1) {
    c["cp"] = l.cp;
    c["cp_comm"] = l.cp_comm;  // the exchange the planner costed
  }
  // The attention kernel the plan costed: train's auto picks the same one, except where the
  // plan was asked for the unfused kernel (--unfused-attention) on a shared host.
  if (j.cluster.compute_units > 0 && l.cp == 1 && !l.fused_attention &&
      j.seq >= plan::kOurCpuFlashMinSeq)
    c["attention"] = "naive";
  if (l.ep > 1) c["ep"] = l.ep;  // train's --ep (docs/planner.md, "Mixture of experts")
  c["zero"] = l.zero;
  c["recompute"] = plan::recompute_name(l.recompute);
  // The planned hardware: a GPU per rank (NCCL between them), or this host's CPU ranks.
  const bool gpus = j.cluster.compute_units == 0;
  c["device"] = gpus ? "cuda" : "cpu";
  if (gpus && j.gpus > 1) c["backend"] = "nccl";
  if (l.pp > 1) {
    c["pp"] = l.pp;
    c["microbatches"] = e.microbatches;
    c["schedule"] = l.schedule;
    c["virtual_stages"] = l.virtual_stages;
    // The split the plan assumed (train's own by default; Megatron's even one under
    // --megatron-2021), so that the run is the layout that was planned.
    c["pp_layers"] = fmt::format("{}", fmt::join(plan::chunk_layers(j, l), ","));
  }
  return c;
}

// Whether some layout passed every divisibility check (memory aside).
bool divisible(const plan::SearchResult& s) {
  return s.fit > 0 || s.dropped.count("out of memory");
}

// The nearest job that some layout divides: the smallest larger batch that is a multiple of a
// possible dp, else the largest smaller GPU count; "" if neither of a few tries does.
std::string what_would_divide(const plan::Job& j, const plan::SearchPins& pins) {
  std::vector<int64_t> batches;
  for (int64_t dp = 1; dp <= j.gpus; ++dp)
    if (j.gpus % dp == 0) batches.push_back((j.batch / dp + 1) * dp);
  std::sort(batches.begin(), batches.end());
  batches.erase(std::unique(batches.begin(), batches.end()), batches.end());
  constexpr size_t kTries = 16;  // each a search: this is the failure path, keep it short
  for (size_t i = 0; i < batches.size() && i < kTries; ++i) {
    plan::Job t = j;
    t.batch = batches[i];
    if (divisible(plan::search(t, pins, 1))) return fmt::format("--batch {}", t.batch);
  }
  for (int64_t g = j.gpus - 1; g >= 1 && g >= j.gpus - int64_t(kTries); --g) {
    plan::Job t = j;
    t.gpus = g;
    if (divisible(plan::search(t, pins, 1))) return fmt::format("--gpus {}", g);
  }
  return "";
}

// Why the search found nothing: memory, or (no layout even divides the job) the most common
// divisibility failure and a job that would divide.
// `see`: where the reasons are ("'dropped' above" in the text, "'dropped'" in the JSON).
std::string no_layout_message(const plan::Job& j, const plan::SearchPins& pins,
                              const plan::SearchResult& s, bool pinned, const std::string& see) {
  const std::string with_pins = pinned ? " with these pins" : "";
  if (divisible(s))
    return fmt::format("no layout of {} fits in the memory of {} x {}{} (see {})", j.model.name,
                       j.gpus, j.cluster.gpu.name, with_pins, see);
  auto most = std::max_element(s.dropped.begin(), s.dropped.end(),
                               [](const auto& a, const auto& b) { return a.second < b.second; });
  std::string msg = fmt::format("no layout of {} divides {} GPUs and batch {}{}", j.model.name,
                                j.gpus, j.batch, with_pins);
  if (most != s.dropped.end()) msg += fmt::format(" (mostly: {})", s.example.at(most->first));
  const std::string fix = what_would_divide(j, pins);
  msg += fix.empty() ? "; see " + see : fmt::format("; {} would work", fix);
  return msg;
}

// plan --json's stdout: the layouts found, why the others were dropped, and (none found)
// the error.
nlohmann::json plan_json(const plan::Job& j, const plan::SearchResult& s,
                         const std::string& error) {
  nlohmann::json out = {{"job", job_json(j)},
                        {"search_s", s.search_s},
                        {"considered", s.considered},
                        {"fit", s.fit},
                        {"replayed", s.replayed}};
  out["layouts"] = nlohmann::json::array();
  for (const auto& e : s.top) out["layouts"].push_back(estimate_json(j, e));
  out["dropped"] = nlohmann::json::object();
  for (const auto& [reason, count] : s.dropped)
    out["dropped"][reason] = {{"count", count}, {"example", s.example.at(reason)}};
  if (!error.empty()) out["error"] = error;
  return out;
}

void run_plan(const PlanFlags& f, int top, const std::optional<std::string>& emit,
              const std::optional<std::string>& html, bool megatron_2021, bool explain,
              const PlanSitesFlags& sites) {
  f.check(megatron_2021);
  plan::Job j = f.job();
  f.check_pins(j, /*search=*/true);
  // A config for `meshtrain train`: planned as our runtime runs it, not as Megatron-LM would.
  if (emit) j.our_runtime = true;
  if (emit) check_trainable(j, f);
  plan::SearchPins pins = f.pins();
  pins.megatron_2021 = megatron_2021;
  const plan::SearchResult s = plan::search(j, pins, top);
  FILE* human = f.json ? stderr : stdout;
  std::fprintf(human, "%s\n",
               fmt::format("plan: {} ({} parameters) on {} x {} ({}), batch {} x seq {}, "
                           "{}: {} layouts, {} fit in memory, {} replayed, {:.2f} s",
                           j.model.name, params_text(j.model.total_params()), j.gpus,
                           j.cluster.gpu.name, j.cluster.name, j.batch, j.seq, j.dtype,
                           s.considered, s.fit, s.replayed, s.search_s)
                   .c_str());
  std::fprintf(human, "%s", estimate_table(s.top).c_str());
  if (!s.dropped.empty()) {
    std::fprintf(human, "dropped:\n");
    for (const auto& [reason, count] : s.dropped)
      std::fprintf(
          human, "%s\n",
          fmt::format("  {:>7}  {}  (e.g. {})", count, reason, s.example.at(reason)).c_str());
  }
  if (s.top.empty()) {
    const std::string why = no_layout_message(j, pins, s, f.pins_any(), "'dropped' above");
    // Scripts read stdout: the reasons as JSON there too, with the exit code of bad input.
    if (f.json) {
      const std::string error = no_layout_message(j, pins, s, f.pins_any(), "'dropped'");
      std::printf("%s\n", plan_json(j, s, error).dump(2).c_str());
    }
    fail("{}", why);
  }
  if (emit) {
    std::optional<std::string> preset;
    if (f.model.model && j.model.name == *f.model.model) {
      for (const auto& n : model::preset_names())
        if (n == *f.model.model) preset = n;
    }
    io::write_file(*emit, train_config(j, s.top.front(), preset).dump(2) + "\n");
    std::fprintf(human, "wrote %s: run it with  meshtrain train --config %s --data FILE\n",
                 emit->c_str(), emit->c_str());
  }
  // --explain: the best layout's step as a stacked list (plan/explain.h).
  std::vector<plan::StepItem> items;
  if (explain) {
    const plan::Estimate& best = s.top.front();
    items = plan::explain(j, best);
    std::fprintf(human, "%s",
                 fmt::format("why the best layout takes {:.4f} s (busiest pipeline rank {}):\n{}",
                             best.step_time_s, best.busiest_rank,
                             plan::explain_text(items, best.step_time_s))
                     .c_str());
  }
  nlohmann::json across = nlohmann::json::object();  // --sites: plan/sites.h
  sites.report(j, s.top.front(), human, &across);
  if (html) {
    obs::write_text_file(
        *html,
        obs::plan_html(plan_json(j, s, ""),
                       fmt::format("meshtrain plan: {} on {} x {}, batch {} x seq {}", j.model.name,
                                   j.gpus, j.cluster.gpu.name, j.batch, j.seq)),
        "--html");
    std::fprintf(human, "wrote %s\n", html->c_str());
  }
  if (f.json) {
    nlohmann::json out = plan_json(j, s, "");
    if (across.contains("sites")) out["sites"] = across["sites"];
    if (explain) {
      out["explain"] = nlohmann::json::array();
      for (const plan::StepItem& it : items)
        out["explain"].push_back({{"name", it.name}, {"seconds", it.seconds}});
    }
    std::printf("%s\n", out.dump(2).c_str());
  }
}

}  // namespace

void register_plan(CLI::App& app) {
  auto f = std::make_shared<PlanFlags>();
  auto top = std::make_shared<int>(10);
  auto emit = std::make_shared<std::optional<std::string>>();
  auto megatron_2021 = std::make_shared<bool>(false);
  auto explain = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand(
      "plan", "search the layouts of a model on a cluster: step time, MFU, memory per GPU");
  f->add_to(*cmd);
  cmd->add_option("--top", *top, "layouts to print (default 10)");
  cmd->add_option("--emit-config", *emit, "write the best layout as a `train --config` file");
  auto html = std::make_shared<std::optional<std::string>>();
  cmd->add_option("--html", *html,
                  "write the ranked layouts, their memory and time breakdowns as bars, to an "
                  "offline HTML page (docs/report.md)");
  cmd->add_flag("--megatron-2021", *megatron_2021,
                "search only what Megatron-LM did in 2021 (no ZeRO, no SP, no selective "
                "recomputation, pp divides n_layer, "
                "interleaving with pp > 2, gradients reduced after the flush when pp > 1, "
                "backward's TP all-reduces not overlapped)");
  cmd->add_flag("--explain", *explain,
                "after the table, the best layout's step as a stacked list: GEMMs by kind, "
                "attention, memory-bound kernels, each exposed communication, bubble, "
                "optimizer (JSON: \"explain\")");
  auto sites = std::make_shared<PlanSitesFlags>();
  sites->add_to(*cmd);
  cmd->callback([f, top, emit, html, megatron_2021, explain, sites] {
    if (*top < 1) fail("--top {} must be at least 1", *top);
    run_plan(*f, *top, *emit, *html, *megatron_2021, *explain, *sites);
  });
}

}  // namespace mt::cli

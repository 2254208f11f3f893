// TrainOptions (train/trainer.h): the checks that refuse a run before any work, naming the
// value and the fix, and the values derived from the options (the microbatch, the attention
// kernel).
#include <fmt/format.h>

#include <cmath>
#include <string>

#include "core/device.h"
#include "core/error.h"
#include "kernels/kernels.h"
#include "model/config.h"
#include "model/gpt.h"
#include "parallel/context.h"
#include "parallel/pipeline/schedule.h"
#include "train/outer_options.h"
#include "train/token_file.h"
#include "train/trainer.h"

namespace mt::train {

int64_t TrainOptions::microbatch_size() const {
  if (microbatch > 0) return microbatch;
  return batch / dp / microbatch_count();
}

int TrainOptions::microbatch_count() const {
  return pipeline.microbatches > 0 ? pipeline.microbatches : pipeline.pp;
}

namespace {

// The numbers of the optimizer and the loop that no layout constrains.
void check_run_numbers(const TrainOptions& o) {
  if (!(o.min_lr_ratio >= 0 && o.min_lr_ratio <= 1))
    fail("--min-lr-ratio {} must be in [0, 1] (the cosine decays to this fraction of --lr)",
         o.min_lr_ratio);
  if (!(o.adamw.weight_decay >= 0) || !std::isfinite(o.adamw.weight_decay))
    fail("--weight-decay {} must be a finite number >= 0", o.adamw.weight_decay);
  if (!(o.grad_clip >= 0) || !std::isfinite(o.grad_clip))
    fail("--grad-clip {} must be a finite number >= 0 (0 turns clipping off)", o.grad_clip);
  if (o.eval_every < 0) fail("--eval-every {} must be 0 (only at the end) or more", o.eval_every);
  if (o.eval_batches < 1) fail("--eval-batches {} must be at least 1", o.eval_batches);
  if (o.threads < 0) fail("--threads {} must be 0 (automatic) or more", o.threads);
  if (o.skip_nonfinite < 0)
    fail("--skip-nonfinite {} must be 0 (stop at the first non-finite step) or more",
         o.skip_nonfinite);
  if (!(o.comm_timeout_s > 0) || !std::isfinite(o.comm_timeout_s))
    fail("--comm-timeout {} must be a positive number of seconds", o.comm_timeout_s);
}

// How the global batch splits: over dp ranks, then into microbatches (of the pipeline, or of
// gradient accumulation with --pp 1). Each message names the flag the user gave.
void check_batch_split(const TrainOptions& o) {
  const PipelineOptions& po = o.pipeline;
  if (po.microbatches < 0) fail("--microbatches {} must be at least 1", po.microbatches);
  if (po.virtual_stages < 1) fail("--virtual-stages {} must be at least 1", po.virtual_stages);
  const int64_t chunks = static_cast<int64_t>(po.pp) * po.virtual_stages;
  // --pp-layers may leave the first and the last chunk without a layer (pp::explicit_partition).
  const bool empty_ends = !po.layers.empty() && chunks > 1;
  const int64_t most = o.model.n_layer + (empty_ends ? 2 : 0);
  if (chunks > most)
    fail(
        "--pp {} x --virtual-stages {} = {} pipeline chunks but the model has {} layers: every "
        "chunk needs at least one{} (use a --pp x --virtual-stages of at most {})",
        po.pp, po.virtual_stages, chunks, o.model.n_layer,
        empty_ends ? " but the first and the last" : "", most);
  if (o.batch % o.dp != 0)
    fail(
        "--batch {} is not divisible by --dp {} (every dp rank takes batch / dp samples; use "
        "--batch {} or {}, or a --dp that divides {})",
        o.batch, o.dp, o.batch / o.dp * o.dp > 0 ? o.batch / o.dp * o.dp : o.dp,
        (o.batch / o.dp + 1) * o.dp, o.batch);
  const int64_t per_replica = o.batch / o.dp;
  const int m = o.microbatch_count();
  const bool count_given = po.microbatches > 0 || po.pp > 1;
  if (count_given && per_replica % m != 0) {
    const std::string which = po.microbatches > 0
                                  ? fmt::format("--microbatches {}", m)
                                  : fmt::format("--pp {} (the default --microbatches)", po.pp);
    fail(
        "{} does not divide the {} sequences per dp replica (--batch {} / --dp {}): each "
        "microbatch holds batch / (dp x microbatches) sequences (use a --batch that is a "
        "multiple of {}, or another --microbatches)",
        which, per_replica, o.batch, o.dp, static_cast<int64_t>(o.dp) * m);
  }
  if (o.microbatch > 0) {
    if (po.microbatches > 0 && o.microbatch * po.microbatches != per_replica)
      fail(
          "--microbatch {} and --microbatches {} disagree: --batch {} / --dp {} = {} sequences "
          "per replica (give one of the two)",
          o.microbatch, po.microbatches, o.batch, o.dp, per_replica);
    if (per_replica % o.microbatch != 0) {
      if (o.dp == 1)
        fail("--microbatch {} does not divide --batch {} (choose a divisor of {})", o.microbatch,
             o.batch, o.batch);
      fail(
          "--batch {} is not divisible by --dp {} x --microbatch {} = {} (use a --batch that is "
          "a multiple of {}, or change --dp / --microbatch)",
          o.batch, o.dp, o.microbatch, o.dp * o.microbatch, o.dp * o.microbatch);
    }
    if (po.pp > 1 && po.microbatches == 0 && o.microbatch * po.pp != per_replica)
      fail(
          "--microbatch {} disagrees with --batch {} / (--dp {} x --microbatches {}) = {} (the "
          "pipeline runs --microbatches, default --pp, per step: give --microbatches {} or "
          "leave --microbatch out)",
          o.microbatch, o.batch, o.dp, m, per_replica / m, per_replica / o.microbatch);
  }
}

// Context parallelism: the split, the exchange, the kernel, what it does not compose with yet.
void check_context_parallel(const TrainOptions& o) {
  parallel::cp::check_split(o.model.seq_len, o.cp);
  const parallel::cp::CpComm comm = parallel::cp::parse_cp_comm(o.cp_comm);
  if (o.cp == 1) return;
  if (comm == parallel::cp::CpComm::kA2a)
    parallel::cp::check_a2a(o.model.n_head / o.tp, o.model.kv_heads() / o.tp, o.model.seq_len,
                            o.cp);
  if (o.device == "cuda")
    fail("--cp {}: context parallelism runs on the CPU so far (use --device cpu, or --cp 1)", o.cp);
  if (o.attention == "naive")
    fail(
        "--cp {} runs the flash-style attention kernel on its pieces of the sequence: use "
        "--attention flash or auto (not naive)",
        o.cp);
  const int64_t local = o.model.seq_len / o.cp;
  if (o.sp && local % o.tp != 0)
    fail(
        "--sp with --cp {}: each rank's {} tokens of a sequence (--seq {} / --cp {}) do not "
        "split over --tp {} (use a --seq that is a multiple of {})",
        o.cp, local, o.model.seq_len, o.cp, o.tp, 2 * o.cp * o.tp);
}

}  // namespace

namespace {
// --ep: the experts split over ep of the dp ranks (folded: the world is pp x dp x cp x tp).
void check_expert_parallel(const TrainOptions& o) {
  if (o.ep < 1) fail("--ep {} must be at least 1", o.ep);
  if (!(o.moe.shadow_above >= 1) || !std::isfinite(o.moe.shadow_above))
    fail(
        "--moe-shadow-above {} must be a number of at least 1 (the default is 1.1: shadow when "
        "the busiest ep rank has 10% more rows than the mean)",
        o.moe.shadow_above);
  if (o.moe.shadow && o.ep == 1)
    fail(
        "--moe-shadow needs expert parallelism (--ep 2 or more): without it every rank holds "
        "all the experts and there is nothing to shadow");
  if (o.ep == 1) return;
  if (!o.model.moe.enabled())
    fail(
        "--ep {}: model {} has no experts to split (expert parallelism needs an MoE model: "
        "--model mixtral-tiny, or --moe-experts N)",
        o.ep, o.model.name);
  if (o.dp % o.ep != 0)
    fail(
        "--ep {} must divide --dp {}: the expert-parallel ranks are carved from the data-"
        "parallel ones (use --dp {}, or an --ep that divides {})",
        o.ep, o.dp, (o.dp / o.ep + 1) * o.ep, o.dp);
  if (o.model.moe.n_experts % o.ep != 0)
    fail("--ep {}: the {} experts do not split over {} ranks (use an --ep that divides {})", o.ep,
         o.model.moe.n_experts, o.ep, o.model.moe.n_experts);
}
}  // namespace

void TrainOptions::validate() const {
  model.validate();
  if (batch < 1) fail("--batch {} must be at least 1", batch);
  if (!(moe.capacity_factor >= 0) || !(moe.aux_loss >= 0) || !(moe.z_loss >= 0))
    fail(
        "--moe-capacity-factor {}, --moe-aux-loss {} and --moe-z-loss {} must be 0 or more "
        "(capacity 0: dropless; typical: 1.25, 0.01, 0.001)",
        moe.capacity_factor, moe.aux_loss, moe.z_loss);
  if (!(moe.bias_rate > 0) || !std::isfinite(moe.bias_rate))
    fail("--moe-bias-rate {} must be a positive number (DeepSeek-V3: 0.001)", moe.bias_rate);
  if (!model.moe.enabled() && moe.balance_bias)
    fail("--moe-balance bias needs an MoE model (--model mixtral-tiny, or --moe-experts N)");
  if (!model.moe.enabled() && (moe.capacity_factor > 0 || moe.aux_loss > 0 || moe.z_loss > 0))
    fail(
        "--moe-capacity-factor, --moe-aux-loss and --moe-z-loss need an MoE model (--model "
        "mixtral-tiny, or --moe-experts N)");
  if (microbatch < 0) fail("--microbatch {} must be at least 1", microbatch);
  if (dp < 1) fail("--dp {} must be at least 1", dp);
  check_expert_parallel(*this);
  if (pipeline.pp < 1) fail("--pp {} must be at least 1", pipeline.pp);
  model::check_tp(model, tp, sp);  // tensor parallelism: refusals naming the valid --tp
  check_context_parallel(*this);
  if (zero < 0 || zero > 3) fail("--zero {} must be 0, 1, 2 or 3", zero);
  if (!(bucket_mb > 0)) fail("--bucket-mb {} must be positive", bucket_mb);
  check_outer_options(outer, dp, device, model.n_layer, ep, steps);
  if (!(sim_link_mbit >= 0) || !(sim_link_ms >= 0) || (sim_link_ms > 0 && sim_link_mbit == 0))
    fail(
        "--sim-link-mbit {} --sim-link-ms {}: a simulated link needs a positive rate in Mbit/s "
        "(and a latency in ms >= 0)",
        sim_link_mbit, sim_link_ms);
  if (outer.delay > 0 && checkpoint_every > 0)
    fail(
        "--outer-delay {} with --checkpoint-every {}: a checkpoint while an overlapped outer "
        "exchange is in flight is not supported (leave --checkpoint-every out: the run still "
        "saves after its last step)",
        outer.delay, checkpoint_every);
  check_batch_split(*this);
  check_run_numbers(*this);
  if (pipeline.exchanges != "auto" && pipeline.exchanges != "batched" &&
      pipeline.exchanges != "per-action")
    fail("--pp-exchanges '{}' is not a grouping (choose auto, batched or per-action)",
         pipeline.exchanges);
  if (pipeline.pp > 1)
    parallel::pp::check_schedule_args(parallel::pp::parse_schedule_kind(pipeline.schedule),
                                      pipeline.pp, microbatch_count(), pipeline.virtual_stages);
  else if (pipeline.virtual_stages > 1)
    fail("--virtual-stages {} needs a pipeline: add --pp 2 or more and --schedule interleaved",
         pipeline.virtual_stages);
  // One chunk per rank, the interleaved schedule is 1F1B under another name.
  if (parallel::pp::parse_schedule_kind(pipeline.schedule) ==
          parallel::pp::ScheduleKind::kInterleaved1F1B &&
      pipeline.virtual_stages < 2)
    fail(
        "--schedule interleaved needs --virtual-stages 2 or more (model chunks per pipeline "
        "rank{}); with one chunk per rank use --schedule 1f1b",
        pipeline.pp > 1 ? "" : ", and --pp 2 or more");
  if (!pipeline.trace.empty() && pipeline.pp == 1)
    fail(
        "--trace {} writes the pipeline's timeline and needs --pp 2 or more (for where the "
        "time goes by kernel, use --profile)",
        pipeline.trace);
  const model::Recompute rc = model::parse_recompute(recompute);
  if (rc == model::Recompute::kFull && pipeline.pp > 1 &&
      parallel::pp::parse_schedule_kind(pipeline.schedule) == parallel::pp::ScheduleKind::kZbH1)
    fail(
        "--recompute full with --schedule zb1: the W pass reads a block's activations after "
        "other blocks' recomputation has reused them (use --recompute selective, or another "
        "schedule)");
  if (dtype != "f32" && dtype != "bf16")
    fail("--dtype '{}' is not a training precision (choose f32 or bf16)", dtype);
  if (device != "cpu" && device != "cuda")
    fail("--device '{}' is not a device (choose cpu or cuda)", device);
  if (backend == "nccl" && device != "cuda")
    fail(
        "--backend nccl moves GPU buffers between GPUs: add --device cuda (or use --backend "
        "local / mpi on the CPU)");
  if (attention != "auto" && attention != "naive" && attention != "flash" && attention != "fused")
    fail(
        "--attention '{}' is not an attention kernel (choose auto, flash or naive; fused is "
        "flash's other name)",
        attention);
  if ((attention == "flash" || attention == "fused") && device == "cuda") {
    if (dtype != "bf16")
      fail(
          "--attention {} on a GPU computes on bf16 tensor cores: add --dtype bf16 (or use "
          "--attention naive for f32)",
          attention);
    const std::string why = kernels::fused_attention_unsupported(model.head_dim(), model.seq_len);
    if (!why.empty()) fail("--attention {}: {} (use --attention naive)", attention, why);
  }
  if (device == "cuda") {
    if (!device::cuda_built())
      fail(
          "--device cuda: this meshtrain was built without CUDA (configure with "
          "-DMESHTRAIN_CUDA=ON where nvcc is installed, or use --device cpu)");
    if (!export_path.empty() && !export_supported())
      fail(
          "--device cuda: --export of a tp > 1 or pp > 1 layout is not supported on a GPU yet "
          "(export works with dp and ZeRO; or train with --device cpu)");
  }
  if (steps < 1) fail("--steps {} must be at least 1", steps);
  if (checkpoint_every < 0) fail("--checkpoint-every {} must be 0 or more", checkpoint_every);
  if (keep_checkpoints < 0) fail("--keep {} must be 0 (all) or more", keep_checkpoints);
  if (stop_after < 0 || stop_after >= steps)
    fail("--stop-after {} must be a step before the last (1 to {}; a run to --steps {} needs none)",
         stop_after, steps - 1, steps);
  if (stop_after > 0 && checkpoint_dir.empty())
    fail("--stop-after {} needs --checkpoint-dir DIR: the run goes on from the step it saves there",
         stop_after);
  if (max_restarts < 0) fail("--max-restarts {} must be 0 or more", max_restarts);
  if (checkpoint_dir.empty() && (checkpoint_every > 0 || resume == "auto" || max_restarts > 0))
    fail("--checkpoint-every, --resume auto and --max-restarts need --checkpoint-dir DIR");
  if (!(lr > 0) || !std::isfinite(lr)) fail("--lr {} must be a positive number", lr);
  if (data.empty())
    fail("no training data: pass --data FILE.bin (make one with `meshtrain prepare`)");
  (void)parse_data_format(data_format);  // refuses a name that is no format
  if (val_fraction < 0 || val_fraction >= 1)
    fail("validation fraction {} must be in [0, 1)", val_fraction);
}

bool TrainOptions::fused_attention() const {
  if (attention == "naive") return false;
  if (cp > 1) return true;  // context parallelism runs the blockwise kernel
  if (attention == "flash" || attention == "fused") return true;
  if (device == "cuda")
    return dtype == "bf16" &&
           kernels::fused_attention_unsupported(model.head_dim(), model.seq_len).empty();
  return cpu_flash_by_default(model.seq_len);
}

bool cpu_flash_by_default(int64_t seq_len) { return seq_len >= kCpuFlashMinSeq; }

}  // namespace mt::train

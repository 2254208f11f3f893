// `meshtrain train`: a preset or a JSON config, every field overridable by a flag.
#include <memory>

#include "cli/commands.h"
#include "cli/model_flags.h"
#include "core/error.h"
#include "train/trainer.h"

namespace mt::cli {

namespace {

struct TrainFlags {
  std::string config;
  ModelFlags model;
  std::optional<int64_t> batch, microbatch, steps, seed, threads, warmup, eval_every, eval_batches;
  std::optional<float> lr, min_lr_ratio, weight_decay, grad_clip;
  std::optional<std::string> data, val_data, metrics, export_path;
  std::optional<double> peak_gflops, bucket_mb, comm_timeout;
  std::optional<int> dp, zero, tp;
  std::optional<std::string> backend;
  bool profile = false;
  train::PipelineOptions pipeline;  // --pp, --microbatches, --schedule, ...
  bool sp = false;
};

const std::vector<std::string> kConfigKeys = {
    "model", "n_layer",      "n_head",     "d_model",      "d_ff",       "vocab",
    "seq",   "bias",         "tied",       "batch",        "microbatch", "steps",
    "lr",    "min_lr_ratio", "warmup",     "weight_decay", "grad_clip",  "seed",
    "data",  "val_data",     "eval_every", "eval_batches", "threads",    "dp",
    "zero",  "bucket_mb",    "backend",    "tp",           "sp"};

train::TrainOptions to_options(const TrainFlags& f) {
  const nlohmann::json j = read_config_file(f.config, kConfigKeys);
  train::TrainOptions o;
  try {
    f.model.apply(o.model, j);
    auto take = [&](const char* key, auto& field, const auto& flag) {
      using T = std::decay_t<decltype(field)>;
      if (j.contains(key)) field = j.at(key).get<T>();
      if (flag) field = static_cast<T>(*flag);
    };
    take("batch", o.batch, f.batch);
    take("microbatch", o.microbatch, f.microbatch);
    take("steps", o.steps, f.steps);
    take("lr", o.lr, f.lr);
    take("min_lr_ratio", o.min_lr_ratio, f.min_lr_ratio);
    take("warmup", o.warmup, f.warmup);
    take("weight_decay", o.adamw.weight_decay, f.weight_decay);
    take("grad_clip", o.grad_clip, f.grad_clip);
    take("seed", o.seed, f.seed);
    take("data", o.data, f.data);
    take("val_data", o.val_data, f.val_data);
    take("eval_every", o.eval_every, f.eval_every);
    take("eval_batches", o.eval_batches, f.eval_batches);
    take("threads", o.threads, f.threads);
    take("dp", o.dp, f.dp);
    take("zero", o.zero, f.zero);
    take("tp", o.tp, f.tp);
    if (j.contains("sp")) o.sp = j.at("sp").get<bool>();
    take("bucket_mb", o.bucket_mb, f.bucket_mb);
    take("backend", o.backend, f.backend);
  } catch (const nlohmann::json::exception& e) {
    fail("config file '{}' has a value of the wrong type: {}", f.config, e.what());
  }
  if (f.metrics) o.metrics = *f.metrics;
  if (f.export_path) o.export_path = *f.export_path;
  if (f.peak_gflops) o.peak_flops = *f.peak_gflops * 1e9;
  if (f.comm_timeout) o.comm_timeout_s = *f.comm_timeout;
  o.profile = f.profile;
  o.pipeline = f.pipeline;
  if (f.sp) o.sp = true;
  return o;
}

}  // namespace

void register_train(CLI::App& app) {
  auto f = std::make_shared<TrainFlags>();
  CLI::App* cmd = app.add_subcommand("train", "train a GPT model");
  cmd->add_option("--config", f->config, "JSON file with any of the fields below (flags win)");
  f->model.add_to(*cmd);
  cmd->add_option("--batch", f->batch, "global batch, in sequences");
  cmd->add_option("--microbatch", f->microbatch,
                  "sequences per forward/backward (gradient accumulation)");
  cmd->add_option("--steps", f->steps, "optimizer steps");
  cmd->add_option("--lr", f->lr, "peak learning rate");
  cmd->add_option("--min-lr-ratio", f->min_lr_ratio, "cosine decays to this fraction of --lr");
  cmd->add_option("--warmup", f->warmup, "linear warmup steps (default 5% of --steps)");
  cmd->add_option("--weight-decay", f->weight_decay, "AdamW weight decay on matrices");
  cmd->add_option("--grad-clip", f->grad_clip, "global gradient-norm clip (0: off)");
  cmd->add_option("--seed", f->seed, "seed of initialisation and randomness");
  cmd->add_option("--data", f->data, "training tokens (llm.c format, `meshtrain prepare`)");
  cmd->add_option("--val-data", f->val_data, "held-out tokens (default: last 5% of --data)");
  cmd->add_option("--eval-every", f->eval_every, "validation loss every N steps (and at the end)");
  cmd->add_option("--eval-batches", f->eval_batches, "microbatches per validation");
  cmd->add_option("--threads", f->threads,
                  "intra-op threads per rank (default: cores / ranks on the host)");
  cmd->add_option("--dp", f->dp, "data-parallel ranks (local: threads; under mpirun: -np)");
  cmd->add_option("--zero", f->zero,
                  "ZeRO stage: 0 DDP, 1 shard optimizer state, 2 + gradients, 3 + parameters");
  cmd->add_option("--tp", f->tp,
                  "tensor-parallel ranks (Megatron: heads, MLP and vocabulary split; world = dp "
                  "x tp)");
  cmd->add_flag("--sp", f->sp, "sequence parallelism in the tp group (needs --tp 2 or more)");
  cmd->add_option("--pp", f->pipeline.pp, "pipeline ranks (world = pp x dp; docs/pipeline.md)");
  cmd->add_option("--microbatches", f->pipeline.microbatches,
                  "pipeline microbatches per step and dp replica (default: --pp)");
  cmd->add_option("--schedule", f->pipeline.schedule,
                  "pipeline schedule: gpipe, 1f1b (default), interleaved or zb1");
  cmd->add_option("--virtual-stages", f->pipeline.virtual_stages,
                  "model chunks per pipeline rank (--schedule interleaved)");
  cmd->add_option("--pp-layers", f->pipeline.layers,
                  "layers per pipeline chunk, e.g. 5,7,7,5 (default: balanced by cost)");
  cmd->add_option("--trace", f->pipeline.trace,
                  "write a Chrome/Perfetto trace of the pipeline (one row per rank)");
  cmd->add_option("--bucket-mb", f->bucket_mb,
                  "DDP / ZeRO-1 gradient bucket size in MiB (default 25)");
  cmd->add_option("--backend", f->backend, "communication: auto (mpi under mpirun), local, mpi");
  cmd->add_option("--comm-timeout", f->comm_timeout,
                  "seconds a collective may wait before the job aborts");
  cmd->add_option("--metrics", f->metrics, "write one JSON object per step to FILE");
  cmd->add_option("--export", f->export_path,
                  "write final weights as safetensors (HF GPT-2 names)");
  cmd->add_option("--peak-gflops", f->peak_gflops, "GEMM peak for MFU (default: measured, cached)");
  cmd->add_flag("--profile", f->profile, "print where the time went, by kernel");
  cmd->callback([f] { train::run_training(to_options(*f)); });
}

}  // namespace mt::cli

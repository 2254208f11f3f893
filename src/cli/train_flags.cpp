#include "cli/train_flags.h"

#include <fmt/format.h>

#include <string_view>

#include "comm/mpi.h"
#include "core/error.h"

namespace mt::cli {

namespace {

const std::vector<std::string> kConfigKeys = {"model",
                                              "n_layer",
                                              "n_head",
                                              "d_model",
                                              "d_ff",
                                              "vocab",
                                              "n_kv_head",
                                              "rope_theta",
                                              "seq",
                                              "bias",
                                              "tied",
                                              "batch",
                                              "microbatch",
                                              "steps",
                                              "lr",
                                              "min_lr_ratio",
                                              "warmup",
                                              "weight_decay",
                                              "grad_clip",
                                              "seed",
                                              "data",
                                              "val_data",
                                              "eval_every",
                                              "eval_batches",
                                              "threads",
                                              "dp",
                                              "zero",
                                              "bucket_mb",
                                              "backend",
                                              "tp",
                                              "sp",
                                              "mesh_order",
                                              "recompute",
                                              "dtype",
                                              "device",
                                              "comm_timeout",
                                              "pp",
                                              "microbatches",
                                              "schedule",
                                              "virtual_stages",
                                              "pp_exchanges",
                                              "pp_layers",
                                              "attention",
                                              "data_format",
                                              "shuffle",
                                              "cp",
                                              "cp_comm",
                                              "skip_nonfinite",
                                              "moe_experts",
                                              "moe_top_k",
                                              "moe_every",
                                              "moe_ff",
                                              "moe_shared_ff",
                                              "moe_router",
                                              "moe_capacity_factor",
                                              "moe_aux_loss",
                                              "moe_balance",
                                              "moe_bias_rate",
                                              "moe_shadow",
                                              "moe_shadow_above",
                                              "moe_z_loss",
                                              "ep",
                                              "sites",
                                              "outer_every",
                                              "outer_optimizer",
                                              "outer_lr",
                                              "outer_momentum",
                                              "outer_compress",
                                              "outer_fragments",
                                              "outer_warmup_steps",
                                              "outer_delay",
                                              "outer_mix",
                                              "sim_link_mbit",
                                              "sim_link_ms"};

}  // namespace

const std::vector<std::string>& train_config_keys() { return kConfigKeys; }

const std::vector<std::string>& train_command_config_keys() {
  static const std::vector<std::string> keys = {
      "metrics",        "export",           "trace",     "peak_gflops", "profile",
      "checkpoint_dir", "checkpoint_every", "keep",      "resume",      "max_restarts",
      "init_from",      "tensorboard",      "stop_after"};
  return keys;
}

void infer_dp_under_mpirun(train::TrainOptions& o, bool dp_given) {
  const int world = comm::mpi_env_world_size();
  if (dp_given || world < 1 || o.backend == "local") return;
  if (o.tp < 1 || o.pipeline.pp < 1 || o.cp < 1) return;  // validate() names the bad value
  const int64_t others = static_cast<int64_t>(o.tp) * o.pipeline.pp * o.cp;
  if (world % others != 0) {
    std::string np, divisors;
    for (int k = 1; k <= 3; ++k) np += fmt::format("{}{}", k > 1 ? ", " : "", k * others);
    for (int d = 1; d <= world; ++d)
      if (world % d == 0) divisors += fmt::format("{}{}", divisors.empty() ? "" : ", ", d);
    fail(
        "mpirun started {} processes, which --tp {} x --pp {}{} = {} does not divide: dp = "
        "processes / (tp x pp{}) would not be whole (run mpirun -np {} ..., or give a --tp x "
        "--pp{} that divides {}: one of {})",
        world, o.tp, o.pipeline.pp, o.cp > 1 ? fmt::format(" x --cp {}", o.cp) : "", others,
        o.cp > 1 ? " x cp" : "", np, o.cp > 1 ? " x --cp" : "", world, divisors);
  }
  o.dp = static_cast<int>(world / others);
}

void TrainFlags::add_to(CLI::App& cmd) {
  cmd.add_option("--config", config, "JSON file with any of the fields below (flags win)");
  model.add_to(cmd);
  const train::TrainOptions d;  // the defaults, named in the help
  cmd.add_option("--batch", batch, fmt::format("global batch, in sequences (default {})", d.batch));
  cmd.add_option("--microbatch", microbatch,
                 "sequences per forward/backward (gradient accumulation)");
  cmd.add_option("--steps", steps,
                 fmt::format("optimizer steps (default {}; verify: 20)", d.steps));
  cmd.add_option("--lr", lr, fmt::format("peak learning rate (default {})", d.lr));
  cmd.add_option(
      "--min-lr-ratio", min_lr_ratio,
      fmt::format("cosine decays to this fraction of --lr (default {})", d.min_lr_ratio));
  cmd.add_option("--warmup", warmup, "linear warmup steps (default 5% of --steps)");
  cmd.add_option("--weight-decay", weight_decay,
                 fmt::format("AdamW weight decay on matrices (default {})", d.adamw.weight_decay));
  cmd.add_option("--grad-clip", grad_clip,
                 fmt::format("global gradient-norm clip (0: off; default {})", d.grad_clip));
  cmd.add_option("--skip-nonfinite", skip_nonfinite,
                 fmt::format("skip the update of a step whose loss or gradient norm is NaN or "
                             "infinite, at most N in a row, then stop (exit 1); 0: stop at the "
                             "first (default {})",
                             d.skip_nonfinite));
  cmd.add_option("--seed", seed,
                 fmt::format("seed of initialisation and randomness (default {})", d.seed));
  cmd.add_option("--data", data,
                 "training tokens: llm.c files, Megatron-LM PREFIXes (.idx + .bin) or nanoGPT "
                 "files (--data-format nanogpt); a comma-separated list and globs "
                 "(shard_*.bin) read as one stream in order (docs/data.md; `meshtrain prepare`)");
  cmd.add_option("--val-data", val_data,
                 "held-out tokens, as --data (default: the last 5% of --data)");
  cmd.add_option("--data-format", data_format,
                 "auto (default: llm.c by its header, Megatron-LM by its .idx), llmc, nanogpt "
                 "(headerless uint16, nanoGPT's prepare.py) or megatron: every file of --data "
                 "and --val-data");
  cmd.add_flag("--shuffle", shuffle,
               "read the training samples in a seeded permutation per epoch (by --seed), the "
               "same in every layout (the default)");
  cmd.add_flag("--no-shuffle", no_shuffle,
               "read the training samples in file order (llm.c's batches)");
  cmd.add_option("--eval-every", eval_every, "validation loss every N steps (and at the end)");
  cmd.add_option("--eval-batches", eval_batches,
                 fmt::format("microbatches per validation (default {})", d.eval_batches));
  cmd.add_option("--threads", threads,
                 "intra-op threads per rank (default: cores / ranks on the host)");
  cmd.add_option("--dp", dp,
                 "data-parallel ranks (local: threads; under mpirun default -np / (tp x pp))");
  cmd.add_option("--zero", zero,
                 "ZeRO stage: 0 DDP, 1 shard optimizer state, 2 + gradients, 3 + parameters");
  cmd.add_option("--tp", tp,
                 "tensor-parallel ranks (Megatron: heads, MLP and vocabulary split; world = dp "
                 "x tp)");
  cmd.add_flag("--sp", sp, "sequence parallelism in the tp group (needs --tp 2 or more)");
  cmd.add_option("--cp", cp,
                 "context-parallel ranks: every sequence split over them, rank i holding chunks "
                 "i and 2cp-1-i of 2cp (world = pp x dp x cp x tp; docs/context_parallel.md)");
  cmd.add_option("--ep", ep,
                 "expert-parallel ranks: the MoE layers' experts split over ep of the --dp ranks "
                 "(ep divides dp; tokens travel by all-to-all; docs/moe.md)");
  cmd.add_option("--cp-comm", cp_comm,
                 fmt::format("how --cp ranks exchange keys and values: ring (point to point, "
                             "overlapped), all-gather, or a2a (Ulysses: heads split over cp; "
                             "default {})",
                             d.cp_comm));
  cmd.add_option("--pp", pp, "pipeline ranks (world = pp x dp; docs/pipeline.md)");
  cmd.add_option("--microbatches", microbatches,
                 "microbatches per step and dp replica (default: --pp; with --pp 1, gradient "
                 "accumulation, like --microbatch batch / (dp x N))");
  cmd.add_option("--schedule", schedule,
                 "pipeline schedule: gpipe, 1f1b (default), interleaved or zb1");
  cmd.add_option("--virtual-stages", virtual_stages,
                 "model chunks per pipeline rank (--schedule interleaved)");
  cmd.add_option("--pp-exchanges", pp_exchanges,
                 "pipeline send/receive grouping: auto (default; batched with --backend nccl), "
                 "batched (Megatron-LM's exchanges, safe on blocking point-to-point) or "
                 "per-action");
  cmd.add_option("--pp-layers", pp_layers,
                 "layers per pipeline chunk, e.g. 5,7,7,5 (default: balanced by cost)");
  cmd.add_option("--bucket-mb", bucket_mb, "DDP / ZeRO-1 gradient bucket size in MiB (default 25)");
  cmd.add_option("--backend", backend,
                 "communication: auto (mpi under mpirun), local, mpi, or nccl (GPUs, with "
                 "--device cuda)");
  cmd.add_option("--mesh-order", mesh_order,
                 "mesh dimensions slowest to fastest (default pp,dp,cp,tp: a tp group on "
                 "neighbouring ranks; cp left out goes just before tp)");
  cmd.add_option("--recompute", recompute,
                 "activation recomputation: none, selective (attention probabilities), full "
                 "(each block's forward again in backward)");
  cmd.add_option("--dtype", dtype,
                 "training precision: f32, or bf16 (GEMMs on bf16 operands, f32 master weights, "
                 "gradients and optimizer state; docs/mixed_precision.md)");
  cmd.add_option("--device", device,
                 "where each rank computes: cpu, or cuda (one GPU per rank: rank r on GPU r mod "
                 "the host's GPUs; docs/cuda.md)");
  cmd.add_option("--attention", attention,
                 "attention kernel: auto (default: on the CPU flash from --seq " +
                     std::to_string(train::kCpuFlashMinSeq) +
                     ", on a GPU flash for --dtype bf16 where the fused kernel has the head dim), "
                     "flash (flash-attention style, O(T) memory: the CPU's blockwise f32 kernel, a "
                     "GPU's fused bf16 kernel; also named fused) or naive (f32 GEMMs and softmax "
                     "over T x T)");
  cmd.add_option("--moe-capacity-factor", moe_capacity_factor,
                 "tokens per expert = C x tokens x top-k / experts; over it the lowest-probability "
                 "assignments are dropped (the token keeps its residual). 0 (default): dropless");
  cmd.add_option("--moe-aux-loss", moe_aux_loss,
                 "coefficient of Switch's load-balancing loss E x sum f_i P_i (default 0; "
                 "Mixtral 0.02, Switch 0.01)");
  cmd.add_option("--moe-z-loss", moe_z_loss,
                 "coefficient of ST-MoE's router z-loss, mean of logsumexp(logits)^2 (default 0; "
                 "ST-MoE 0.001)");
  cmd.add_option("--moe-balance", moe_balance,
                 "none (default), or bias: DeepSeek-V3's auxiliary-loss-free balancing, a "
                 "per-expert bias on the router's choice moved by --moe-bias-rate after each step "
                 "towards the mean load");
  cmd.add_option("--moe-bias-rate", moe_bias_rate,
                 "how far --moe-balance bias moves a bias per step (default 0.001, DeepSeek-V3's)");
  cmd.add_flag("--moe-shadow", moe_shadow,
               "with --ep: shadow the experts of an overloaded rank (FasterMoE): their weights go "
               "to every ep rank and each runs its own rows of them, the gradients summed back "
               "(docs/moe.md; default: off, rows always go to the expert's rank)");
  cmd.add_option("--moe-shadow-above", moe_shadow_above,
                 "--moe-shadow acts while the busiest ep rank's rows exceed this multiple of the "
                 "mean (default 1.1)");
  const train::OuterOptions od;
  cmd.add_option("--sites", sites,
                 "DiLoCo: split --dp into S sites that each take --outer-every inner steps on "
                 "their own, then average their parameter change over the links between sites "
                 "(docs/diloco.md; default: off, synchronous dp)");
  cmd.add_option("--outer-every", outer_every,
                 fmt::format("--sites: inner steps per outer round, H (default {})", od.every));
  cmd.add_option("--outer-optimizer", outer_optimizer,
                 "--sites: nesterov (SGD with Nesterov momentum on the mean pseudo-gradient, "
                 "DiLoCo's; the default) or average (plain averaging)");
  cmd.add_option("--outer-lr", outer_lr,
                 fmt::format("--sites: outer learning rate (default {})", od.lr));
  cmd.add_option("--outer-momentum", outer_momentum,
                 fmt::format("--sites: outer Nesterov momentum (default {})", od.momentum));
  cmd.add_option("--outer-compress", outer_compress,
                 "--sites: the outer exchange as none (f32, the default), bf16, or int8 (8-bit "
                 "with an f32 scale per 128 elements)");
  cmd.add_option("--outer-fragments", outer_fragments,
                 "--sites: streaming DiLoCo, the layers in F fragments each synchronised at its "
                 "own inner step of the round (1/F of the bytes at a time; default 1)");
  cmd.add_option("--outer-warmup-steps", outer_warmup,
                 "--sites: the first W steps synchronous over all sites (gradients averaged "
                 "across sites), the outer rounds after them: DiLoCo from a synchronously "
                 "trained start (default 0); a synchronous checkpoint of a step <= W (--resume) "
                 "stands for its steps (a start trained in one place: train --stop-after W)");
  cmd.add_option("--outer-delay", outer_delay,
                 "--sites: overlap each outer exchange with this many inner steps (streaming "
                 "DiLoCo's τ; default 0: blocking)");
  cmd.add_option("--outer-mix", outer_mix,
                 fmt::format("--outer-delay: the site keeps this share of its own values when "
                             "the exchange lands (α; default {})",
                             od.mix));
  cmd.add_option("--sim-link-mbit", sim_link_mbit,
                 "benchmarks: simulate a link of this many Mbit/s between sites (the cross-site "
                 "groups with --sites, else the dp gradient group; docs/diloco.md)");
  cmd.add_option("--sim-link-ms", sim_link_ms,
                 "--sim-link-mbit: the link's latency per message in ms (default 0)");
  cmd.add_option("--comm-timeout", comm_timeout,
                 fmt::format("seconds a collective may wait before the job aborts (default {})",
                             d.comm_timeout_s));
}

train::TrainOptions TrainFlags::to_options() const {
  train::TrainOptions o;
  apply_to(o, config_json());
  return o;
}

nlohmann::json TrainFlags::config_json(const std::vector<std::string>& command_keys) const {
  std::vector<std::string> known = kConfigKeys;
  known.insert(known.end(), command_keys.begin(), command_keys.end());
  return read_config_file(config, known);
}

void TrainFlags::apply_to(train::TrainOptions& o, const nlohmann::json& j) const {
  try {
    model.apply(o.model, j);
    take_config(j, "batch", o.batch, batch);
    take_config(j, "microbatch", o.microbatch, microbatch);
    take_config(j, "steps", o.steps, steps);
    take_config(j, "lr", o.lr, lr);
    take_config(j, "min_lr_ratio", o.min_lr_ratio, min_lr_ratio);
    take_config(j, "warmup", o.warmup, warmup);
    // -1 is the options' "5% of the steps"; a user's negative count is a mistake.
    if ((warmup || j.contains("warmup")) && o.warmup < 0)
      fail("--warmup {} must be 0 or more (leave it out for 5% of --steps)", o.warmup);
    take_config(j, "weight_decay", o.adamw.weight_decay, weight_decay);
    take_config(j, "grad_clip", o.grad_clip, grad_clip);
    take_config(j, "skip_nonfinite", o.skip_nonfinite, skip_nonfinite);
    take_config(j, "seed", o.seed, seed);
    take_config(j, "data", o.data, data);
    take_config(j, "val_data", o.val_data, val_data);
    take_config(j, "data_format", o.data_format, data_format);
    if (shuffle && no_shuffle) fail("--shuffle and --no-shuffle contradict each other");
    if (j.contains("shuffle")) o.shuffle = config_value<bool>(j, "shuffle");
    if (shuffle) o.shuffle = true;
    if (no_shuffle) o.shuffle = false;
    take_config(j, "eval_every", o.eval_every, eval_every);
    take_config(j, "eval_batches", o.eval_batches, eval_batches);
    take_config(j, "threads", o.threads, threads);
    // 0 is the options' "cores / ranks"; asked for by name it would be no threads at all.
    if ((threads || j.contains("threads")) && o.threads == 0)
      fail(
          "--threads 0: a rank needs at least 1 thread (leave --threads out for the host's "
          "cores / ranks on it)");
    take_config(j, "dp", o.dp, dp);
    take_config(j, "zero", o.zero, zero);
    take_config(j, "tp", o.tp, tp);
    take_config(j, "cp", o.cp, cp);
    take_config(j, "cp_comm", o.cp_comm, cp_comm);
    if (j.contains("sp")) o.sp = config_value<bool>(j, "sp");
    if (sp) o.sp = true;
    take_config(j, "bucket_mb", o.bucket_mb, bucket_mb);
    take_config(j, "backend", o.backend, backend);
    take_config(j, "mesh_order", o.mesh_order, mesh_order);
    take_config(j, "recompute", o.recompute, recompute);
    take_config(j, "dtype", o.dtype, dtype);
    take_config(j, "device", o.device, device);
    take_config(j, "attention", o.attention, attention);
    take_config(j, "comm_timeout", o.comm_timeout_s, comm_timeout);
    take_config(j, "ep", o.ep, ep);  // `plan --emit-config` writes the ep it planned
    take_config(j, "moe_capacity_factor", o.moe.capacity_factor, moe_capacity_factor);
    take_config(j, "moe_aux_loss", o.moe.aux_loss, moe_aux_loss);
    std::string balance = o.moe.balance_bias ? "bias" : "none";
    take_config(j, "moe_balance", balance, moe_balance);
    if (balance != "none" && balance != "bias")
      fail(
          "--moe-balance '{}' is not a balancing method (choose none, or bias: DeepSeek-V3's "
          "auxiliary-loss-free per-expert selection bias; the Switch loss is --moe-aux-loss)",
          balance);
    o.moe.balance_bias = balance == "bias";
    take_config(j, "moe_bias_rate", o.moe.bias_rate, moe_bias_rate);
    take_config(j, "moe_shadow", o.moe.shadow, moe_shadow);
    take_config(j, "moe_shadow_above", o.moe.shadow_above, moe_shadow_above);
    take_config(j, "moe_z_loss", o.moe.z_loss, moe_z_loss);
    take_config(j, "sites", o.outer.sites, sites);
    take_config(j, "outer_every", o.outer.every, outer_every);
    take_config(j, "outer_optimizer", o.outer.optimizer, outer_optimizer);
    take_config(j, "outer_lr", o.outer.lr, outer_lr);
    take_config(j, "outer_momentum", o.outer.momentum, outer_momentum);
    take_config(j, "outer_compress", o.outer.compress, outer_compress);
    take_config(j, "outer_fragments", o.outer.fragments, outer_fragments);
    take_config(j, "outer_warmup_steps", o.outer.warmup, outer_warmup);
    take_config(j, "outer_delay", o.outer.delay, outer_delay);
    take_config(j, "outer_mix", o.outer.mix, outer_mix);
    take_config(j, "sim_link_mbit", o.sim_link_mbit, sim_link_mbit);
    take_config(j, "sim_link_ms", o.sim_link_ms, sim_link_ms);
    take_config(j, "pp", o.pipeline.pp, pp);
    take_config(j, "microbatches", o.pipeline.microbatches, microbatches);
    take_config(j, "schedule", o.pipeline.schedule, schedule);
    take_config(j, "virtual_stages", o.pipeline.virtual_stages, virtual_stages);
    take_config(j, "pp_exchanges", o.pipeline.exchanges, pp_exchanges);
    take_config(j, "pp_layers", o.pipeline.layers, pp_layers);
    // A warmup longer than the run never reaches --lr nor starts the cosine decay.
    if ((warmup || j.contains("warmup")) && o.warmup > o.steps)
      fail(
          "--warmup {} is longer than --steps {}: the learning rate would never reach --lr {} "
          "nor decay (use --warmup {} or less, or leave it out for 5% of --steps)",
          o.warmup, o.steps, o.lr, o.steps);
  } catch (const Error& e) {
    // A config value's error names its key; a flag's names the flag, without the file.
    if (config.empty() || std::string_view(e.what()).rfind("config key", 0) != 0) throw;
    fail("{} (config file '{}')", e.what(), config);
  }
}

}  // namespace mt::cli

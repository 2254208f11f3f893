// The flags of a training run (model, layout, data, optimizer), shared by `train` and
// `verify` so that the two cannot drift: a preset or a JSON config, every field
// overridable by a flag.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "cli/model_flags.h"
#include "train/trainer.h"

namespace mt::cli {

struct TrainFlags {
  std::string config;
  ModelFlags model;
  std::optional<int64_t> batch, microbatch, steps, seed, threads, warmup, eval_every, eval_batches;
  std::optional<float> lr, min_lr_ratio, weight_decay, grad_clip;
  std::optional<std::string> data, val_data, data_format;
  bool shuffle = false, no_shuffle = false;  // --shuffle / --no-shuffle (default: the config's)
  std::optional<double> bucket_mb, comm_timeout;
  std::optional<double> moe_capacity_factor, moe_aux_loss, moe_z_loss, moe_bias_rate;
  std::optional<std::string> moe_balance;  // none, bias
  std::optional<bool> moe_shadow;
  std::optional<double> moe_shadow_above;
  std::optional<int> dp, zero, tp, cp, ep, skip_nonfinite;
  std::optional<std::string> cp_comm;  // --cp-comm all-gather
  std::optional<std::string> backend, mesh_order, recompute;
  std::optional<std::string> dtype;      // --dtype f32 | bf16
  std::optional<std::string> device;     // --device cpu | cuda
  std::optional<std::string> attention;  // --attention auto | flash (fused) | naive
  std::optional<int> pp, microbatches, virtual_stages;
  std::optional<std::string> schedule, pp_exchanges, pp_layers;
  bool sp = false;
  // DiLoCo (docs/diloco.md): --sites, --outer-every, --outer-optimizer, --outer-lr,
  // --outer-momentum, --outer-compress, --outer-fragments, --outer-warmup-steps,
  // --outer-delay, --outer-mix.
  std::optional<int> sites, outer_fragments;
  std::optional<int64_t> outer_every, outer_warmup, outer_delay;
  std::optional<std::string> outer_optimizer, outer_compress;
  std::optional<float> outer_lr, outer_momentum, outer_mix;
  std::optional<double> sim_link_mbit, sim_link_ms;

  // Registers the flags above on `cmd` (not --metrics, --export, --trace, --profile,
  // --peak-gflops or the checkpoint flags: those are the train command's own).
  void add_to(CLI::App& cmd);
  // The --config file (an empty object without one), refusing a key that is neither a run
  // field nor one of `command_keys` (the command's own, which it reads itself).
  nlohmann::json config_json(const std::vector<std::string>& command_keys = {}) const;
  // Applies the config's run fields, then the flags, over what `o` holds.
  void apply_to(train::TrainOptions& o, const nlohmann::json& config_file) const;
  train::TrainOptions to_options() const;  // over TrainOptions' defaults
};

// Under mpirun (a backend other than local) without --dp: dp = the processes / (tp x pp), as
// Megatron-LM and torchtitan infer it; refuses a world that tp x pp does not divide, naming
// the -np and --tp / --pp that would. `dp_given`: --dp as a flag or config key.
void infer_dp_under_mpirun(train::TrainOptions& o, bool dp_given);

// The config keys of the train command's own flags (outputs and checkpoints: metrics,
// export, trace, checkpoint_dir, ...), which `train` reads and `verify` accepts and ignores,
// so that one config file serves both.
const std::vector<std::string>& train_command_config_keys();
// The config file's keys of the run (each also a flag: "moe_aux_loss" is --moe-aux-loss).
const std::vector<std::string>& train_config_keys();

}  // namespace mt::cli

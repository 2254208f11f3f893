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
  std::optional<std::string> data, val_data;
  std::optional<double> bucket_mb, comm_timeout;
  std::optional<int> dp, zero, tp;
  std::optional<std::string> backend, mesh_order, recompute;
  std::optional<std::string> dtype;   // --dtype f32 | bf16
  std::optional<std::string> device;  // --device cpu | cuda
  train::PipelineOptions pipeline;   // --pp, --microbatches, --schedule, ...
  bool sp = false;

  // Registers the flags above on `cmd` (not --metrics, --export, --trace, --profile or
  // --peak-gflops: those are the train command's own outputs).
  void add_to(CLI::App& cmd);
  // Applies the config file's fields, then the flags, over what `o` holds.
  void apply_to(train::TrainOptions& o) const;
  train::TrainOptions to_options() const;  // over TrainOptions' defaults
};

}  // namespace mt::cli

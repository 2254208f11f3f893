// The flags of `meshtrain train` (the shared run flags of cli/train_flags.h plus what only
// train writes: metrics, checkpoints, export), and the options they make. `train` registers
// them; `launch` (cli/launch.cpp) parses the job's train command with the same parser, so
// that the two read a command line the same way.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "cli/train_flags.h"
#include "train/trainer.h"

namespace mt::cli {

struct TrainCommandFlags {
  TrainFlags run;
  std::optional<std::string> metrics, tensorboard, export_path, trace, init_from;
  std::optional<double> peak_gflops;
  bool profile = false;
  std::optional<std::string> checkpoint_dir, resume;  // docs/checkpoints.md
  std::optional<int64_t> checkpoint_every, stop_after;
  std::optional<int> keep, max_restarts;
};

// Registers every flag of `train` on `cmd`, into `f`.
void add_train_command_flags(CLI::App& cmd, TrainCommandFlags& f);

// The run's options: the --config file's fields, then the flags (dp inferred under mpirun).
train::TrainOptions train_command_options(const TrainCommandFlags& f);

}  // namespace mt::cli

// `meshtrain train`: a preset or a JSON config, every field overridable by a flag.
#include <memory>

#include "cli/commands.h"
#include "cli/train_flags.h"
#include "core/error.h"
#include "train/trainer.h"

namespace mt::cli {

namespace {

// The shared run flags (cli/train_flags.h) plus what only `train` writes.
struct TrainCommandFlags {
  TrainFlags run;
  std::optional<std::string> metrics, export_path;
  std::optional<double> peak_gflops;
  bool profile = false;
  std::string checkpoint_dir, resume;  // docs/checkpoints.md
  int64_t checkpoint_every = 0;
  int keep = 3, max_restarts = 0;
};

train::TrainOptions to_options(const TrainCommandFlags& f) {
  train::TrainOptions o = f.run.to_options();
  if (f.metrics) o.metrics = *f.metrics;
  if (f.export_path) o.export_path = *f.export_path;
  if (f.peak_gflops) o.peak_flops = *f.peak_gflops * 1e9;
  o.profile = f.profile;
  o.checkpoint_dir = f.checkpoint_dir;
  o.checkpoint_every = f.checkpoint_every;
  o.keep_checkpoints = f.keep;
  o.resume = f.resume;
  o.max_restarts = f.max_restarts;
  return o;
}

}  // namespace

void register_train(CLI::App& app) {
  auto f = std::make_shared<TrainCommandFlags>();
  CLI::App* cmd = app.add_subcommand("train", "train a GPT model");
  f->run.add_to(*cmd);
  cmd->add_option("--trace", f->run.pipeline.trace,
                  "write a Chrome/Perfetto trace of the pipeline (one row per rank)");
  cmd->add_option("--metrics", f->metrics, "write one JSON object per step to FILE");
  cmd->add_option("--export", f->export_path,
                  "write final weights as safetensors (HF GPT-2 names)");
  cmd->add_option("--peak-gflops", f->peak_gflops, "GEMM peak for MFU (default: measured, cached)");
  cmd->add_flag("--profile", f->profile, "print where the time went, by kernel");
  cmd->add_option("--checkpoint-dir", f->checkpoint_dir,
                  "save sharded checkpoints into DIR/step-N (and after the last step)");
  cmd->add_option("--checkpoint-every", f->checkpoint_every, "save every N steps (0: at the end)");
  cmd->add_option("--keep", f->keep, "checkpoints kept in --checkpoint-dir (0: all)");
  cmd->add_option("--resume", f->resume,
                  "auto (newest valid in --checkpoint-dir, or from scratch) or a checkpoint");
  cmd->add_option("--max-restarts", f->max_restarts,
                  "restart a failed run from the newest checkpoint up to N times (local backend)");
  cmd->callback([f] { train::run_training(to_options(*f)); });
}

}  // namespace mt::cli

// `meshtrain train`'s flags and the options they make (cli/train_command.h).
#include "cli/train_command.h"

#include <cmath>
#include <string_view>

#include "core/error.h"
#include "train/init_from.h"

namespace mt::cli {

void add_train_command_flags(CLI::App& cmd, TrainCommandFlags& f) {
  f.run.add_to(cmd);
  cmd.add_option("--trace", f.trace,
                 "write a Chrome/Perfetto trace of the pipeline (one row per rank)");
  cmd.add_option("--metrics", f.metrics, "write one JSON object per step to FILE");
  cmd.add_option("--tensorboard", f.tensorboard,
                 "write the step scalars as TensorBoard event files into DIR (made if missing)");
  cmd.add_option("--export", f.export_path,
                 "write the final weights in Hugging Face names: a FILE.safetensors, or a "
                 "folder (model.safetensors + config.json)");
  cmd.add_option("--init-from", f.init_from,
                 "start from Hugging Face weights (a .safetensors file, or a folder with "
                 "config.json and model.safetensors or the hub's shards): fine-tuning, any "
                 "layout; without --model, the file's model");
  cmd.add_option("--peak-gflops", f.peak_gflops, "GEMM peak for MFU (default: measured, cached)");
  cmd.add_flag("--profile", f.profile,
               "print where the time went, by kernel, over the training steps after the first "
               "(rank 0's; validation forwards not counted; a region's own time, without the "
               "regions inside it)");
  cmd.add_option("--checkpoint-dir", f.checkpoint_dir,
                 "save sharded checkpoints into DIR/step-N (and after the last step)");
  cmd.add_option("--checkpoint-every", f.checkpoint_every, "save every N steps (0: at the end)");
  cmd.add_option("--stop-after", f.stop_after,
                 "train steps 1..N of the --steps schedule, save step N into --checkpoint-dir and "
                 "stop (exit 0); --resume goes on from it (a warm-up trained in one place, a run "
                 "in pieces)");
  cmd.add_option("--keep", f.keep, "checkpoints kept in --checkpoint-dir (0: all; default 3)");
  cmd.add_option("--resume", f.resume,
                 "auto (newest valid in --checkpoint-dir, or from scratch) or a checkpoint");
  cmd.add_option("--max-restarts", f.max_restarts,
                 "restart a failed run from the newest checkpoint up to N times (local backend)");
}

train::TrainOptions train_command_options(const TrainCommandFlags& f) {
  const nlohmann::json j = f.run.config_json(train_command_config_keys());
  train::TrainOptions o;
  f.run.apply_to(o, j);
  infer_dp_under_mpirun(o, f.run.dp.has_value() || j.contains("dp"));
  try {
    take_config(j, "metrics", o.metrics, f.metrics);
    take_config(j, "tensorboard", o.tensorboard, f.tensorboard);
    take_config(j, "export", o.export_path, f.export_path);
    take_config(j, "trace", o.pipeline.trace, f.trace);
    double peak_gflops = 0;
    take_config(j, "peak_gflops", peak_gflops, f.peak_gflops);
    if (f.peak_gflops || j.contains("peak_gflops")) {
      if (!(peak_gflops > 0) || !std::isfinite(peak_gflops))
        fail("--peak-gflops {} must be a positive number", peak_gflops);
      o.peak_flops = peak_gflops * 1e9;
    }
    if (j.contains("profile")) o.profile = config_value<bool>(j, "profile");
    if (f.profile) o.profile = true;
    take_config(j, "checkpoint_dir", o.checkpoint_dir, f.checkpoint_dir);
    take_config(j, "checkpoint_every", o.checkpoint_every, f.checkpoint_every);
    take_config(j, "stop_after", o.stop_after, f.stop_after);
    take_config(j, "keep", o.keep_checkpoints, f.keep);
    take_config(j, "resume", o.resume, f.resume);
    take_config(j, "max_restarts", o.max_restarts, f.max_restarts);
    take_config(j, "init_from", o.init_from, f.init_from);
    // --init-from without --model (flag or config): the file's model, at --seq if given.
    if (!o.init_from.empty() && !f.run.model.model && !j.contains("model")) {
      const int64_t seq = o.model.seq_len;
      const bool seq_given = f.run.model.seq.has_value() || j.contains("seq");
      o.model = train::init_weights_config(o.init_from, f.run.model.n_head);
      if (seq_given) o.model.seq_len = seq;
      o.model.validate();
    }
  } catch (const Error& e) {
    // A config value's error names its key; a flag's names the flag, without the file.
    if (f.run.config.empty() || std::string_view(e.what()).rfind("config key", 0) != 0) throw;
    fail("{} (config file '{}')", e.what(), f.run.config);
  }
  return o;
}

}  // namespace mt::cli

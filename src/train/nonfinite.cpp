#include "train/nonfinite.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "core/error.h"
#include "core/write_file.h"
#include "train/trainer.h"

namespace mt::train {

namespace fs = std::filesystem;
using json = nlohmann::json;

int64_t first_nonfinite(const float* p, int64_t n) {
  // x * 0 is 0 for a finite x and NaN for an infinite or NaN one: the sum of a block of
  // these (a loop the compiler vectorizes) says whether to look at its elements one by one.
  constexpr int64_t kBlock = 1024;
  for (int64_t lo = 0; lo < n; lo += kBlock) {
    const int64_t hi = std::min(n, lo + kBlock);
    float s = 0;
    for (int64_t i = lo; i < hi; ++i) s += p[i] * 0.0f;  // 0 for finite, NaN otherwise
    if (s == 0) continue;
    for (int64_t i = lo; i < hi; ++i)
      if (!std::isfinite(p[i])) return i;
  }
  return -1;
}

std::string describe_nonfinite(const std::string& what, const float* p, int64_t n) {
  const int64_t first = first_nonfinite(p, n);
  if (first < 0) return "";
  int64_t count = 0;
  for (int64_t i = first; i < n; ++i) count += std::isfinite(p[i]) ? 0 : 1;
  return fmt::format("{} holds {} non-finite value(s) of {} (the first, element {}, is {})", what,
                     count, n, first, p[first]);
}

bool NonFiniteGuard::record(bool nonfinite) {
  if (!nonfinite) {
    in_row_ = 0;
    return false;
  }
  ++in_row_;
  ++total_;
  return in_row_ > limit_;
}

json run_settings(const TrainOptions& o) {
  const PipelineOptions& po = o.pipeline;
  return {{"lr", o.lr},
          {"min_lr_ratio", o.min_lr_ratio},
          {"warmup", o.warmup >= 0 ? o.warmup : o.steps / 20},
          {"steps", o.steps},
          {"grad_clip", o.grad_clip},
          {"adamw", {o.adamw.beta1, o.adamw.beta2, o.adamw.eps, o.adamw.weight_decay}},
          {"seed", o.seed},
          {"data", o.data},
          {"data_format", o.data_format},
          {"shuffle", o.shuffle},
          {"init_from", o.init_from},
          {"batch", o.batch},
          {"microbatch", o.microbatch_size()},
          {"dtype", o.dtype},
          {"device", o.device},
          {"layout",
           {{"dp", o.dp},
            {"tp", o.tp},
            {"pp", po.pp},
            {"zero", o.zero},
            {"sp", o.sp},
            {"schedule", po.schedule},
            {"virtual_stages", po.virtual_stages},
            {"mesh_order", o.mesh_order}}},
          {"skip_nonfinite", o.skip_nonfinite}};
}

namespace {

fs::path marker_path(const std::string& dir) { return fs::path(dir) / "nonfinite.json"; }

std::string checkpoint_name(const std::string& dir, int64_t step) {
  return (fs::path(dir) / fmt::format("step-{:08}", step)).string();
}

}  // namespace

void write_nonfinite_marker(const std::string& checkpoint_dir, int64_t from_step,
                            int64_t failed_step, const TrainOptions& o) {
  if (checkpoint_dir.empty()) return;
  const json j = {{"from_step", from_step},
                  {"failed_step", failed_step},
                  {"what",
                   "a run with these settings, started from the checkpoint of step "
                   "from_step (0: from scratch), stopped at failed_step: its loss or "
                   "gradient norm was not finite for more than skip_nonfinite steps in "
                   "a row; meshtrain refuses to resume into the same failure (delete "
                   "this file to try anyway)"},
                  {"settings", run_settings(o)}};
  // Best effort: the run is failing already, and the marker only saves a futile restart.
  try {
    io::write_file(marker_path(checkpoint_dir).string(), j.dump(1) + "\n");
  } catch (const Error& e) {
    std::fprintf(stderr, "warning: %s\n", e.what());
  }
}

void refuse_known_nonfinite_start(const TrainOptions& o, int64_t start_step, bool talk) {
  if (o.resume.empty() || o.checkpoint_dir.empty()) return;
  std::ifstream in(marker_path(o.checkpoint_dir));
  if (!in) return;
  std::stringstream text;
  text << in.rdbuf();
  const json j = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("from_step") || !j.contains("failed_step") ||
      !j["from_step"].is_number_integer() || !j["failed_step"].is_number_integer() ||
      !j.contains("settings"))
    return;  // not ours, or damaged: it only ever saves a futile restart
  const int64_t from = j["from_step"].get<int64_t>(), failed = j["failed_step"].get<int64_t>();
  if (start_step < from || start_step >= failed) return;  // another trajectory
  const json now = run_settings(o);
  if (now != j["settings"]) {
    if (talk) {
      std::string changed;
      for (const auto& [key, value] : now.items())
        if (!j["settings"].contains(key) || j["settings"][key] != value)
          changed += (changed.empty() ? "" : ", ") + key;
      std::fprintf(stderr,
                   "resuming where a run stopped on non-finite steps (step %lld), with changed "
                   "settings: %s\n",
                   static_cast<long long>(failed), changed.c_str());
    }
    return;
  }
  const std::string start = start_step == 0
                                ? "starting from scratch"
                                : fmt::format("resuming from checkpoint '{}'",
                                              checkpoint_name(o.checkpoint_dir, start_step));
  fail(
      "{} with these settings ended in non-finite steps at step {} before (its loss or "
      "gradient norm was NaN or infinite for more than --skip-nonfinite {} steps in a row): "
      "it would fail the same way (change a setting: lower --lr, raise --warmup, clip harder "
      "with --grad-clip; '{}' records the failure: delete it to try the same settings anyway)",
      start, failed, o.skip_nonfinite, marker_path(o.checkpoint_dir).string());
}

void clear_nonfinite_marker(const std::string& checkpoint_dir) {
  if (checkpoint_dir.empty()) return;
  std::error_code ec;
  fs::remove(marker_path(checkpoint_dir), ec);
}

}  // namespace mt::train

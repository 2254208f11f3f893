// The NaN/Inf guard (docs/checkpoints.md, "Non-finite steps"): a step whose loss or
// gradient norm is not finite is found before the optimizer step on every rank together (a
// flag in the step's scalar all-reduce over the whole world, so every rank of every layout
// decides alike), its update is skipped (at most --skip-nonfinite in a row), and past that
// the run stops (exit 1) naming the step. Nothing non-finite is written: a checkpoint or an
// export is checked first (first_nonfinite) and refused. A run stopped this way leaves
// DIR/nonfinite.json in its --checkpoint-dir, so that a restart with the same settings
// (--max-restarts, the supervisor, the same command again) does not resume into the same
// failure: it is refused, naming the checkpoint and the step.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace mt::train {

struct TrainOptions;

// The first element of p[0, n) that is NaN or infinite, or -1.
int64_t first_nonfinite(const float* p, int64_t n);

// "WHAT holds N non-finite value(s) of n (the first, element K, is nan)", or "" when all of
// p[0, n) is finite.
std::string describe_nonfinite(const std::string& what, const float* p, int64_t n);

// Consecutive non-finite steps and what to do with the next one.
class NonFiniteGuard {
 public:
  explicit NonFiniteGuard(int limit, int64_t in_row = 0) : limit_(limit), in_row_(in_row) {}
  // Records one step: a finite one resets the count. Returns whether the run must stop (more
  // than `limit` non-finite steps in a row).
  bool record(bool nonfinite);
  int64_t in_row() const { return in_row_; }
  int64_t skipped_total() const { return total_; }
  int limit() const { return limit_; }

 private:
  int limit_;
  int64_t in_row_;
  int64_t total_ = 0;
};

// What determines a run's numbers from a checkpoint on (learning rate and its schedule,
// clipping, AdamW, seed, data and its order, batch, dtype, layout, --skip-nonfinite): a
// restart with all of these unchanged repeats the same steps bit for bit.
nlohmann::json run_settings(const TrainOptions& o);

// The marker of a run stopped by non-finite steps: step `failed_step` failed, the run having
// started from checkpoint `from_step` (0: from scratch). Written by world rank 0.
void write_nonfinite_marker(const std::string& checkpoint_dir, int64_t from_step,
                            int64_t failed_step, const TrainOptions& o);
// After resuming at `start_step` (0: from scratch) with --resume: refuses (exit 2) when the
// marker says that this start with these settings ended in non-finite steps, naming the
// checkpoint and the step. A changed setting passes, and says so on `talk`.
void refuse_known_nonfinite_start(const TrainOptions& o, int64_t start_step, bool talk);
// A run that was allowed to start saved a checkpoint: the marker is obsolete (the directory
// holds another trajectory now; a new failure writes a new one).
void clear_nonfinite_marker(const std::string& checkpoint_dir);

}  // namespace mt::train

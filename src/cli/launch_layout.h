// What `meshtrain launch` (cli/launch.cpp, docs/multihost.md) decides before each start of
// the job: the hosts of a hostfile, and the largest layout that fits the hosts that answer
// while keeping the global batch. dp shrinks first (tp x pp as the first layout had them);
// only where even the smallest dp does not fit do tp and pp shrink (to divisors of theirs),
// and where several such layouts use the most ranks, the planner's model (src/plan) ranks
// them by step time. cp and ep never change (a checkpoint reshards over dp, tp and pp; ep is
// carved from dp, so dp stays a multiple of it). Never more ranks than `cap` (the whole
// hostfile's layout, or --dp's).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "train/trainer.h"

namespace mt::cli::launch {

struct Host {
  std::string name;
  int slots = 1;
};

// An Open MPI hostfile: `NAME [slots=N] ...` per line, `#` comments. Throws mt::Error (bad
// input) naming the file and line of a malformed entry, or a file naming no host.
std::vector<Host> read_hostfile(const std::string& path);
std::string hostfile_text(const std::vector<Host>& hosts);  // the same format, one per line

struct Layout {
  int dp = 1, tp = 1, pp = 1;
  int cp = 1, ep = 1;  // the job's own, kept in every layout (ep: of dp's ranks)
  int ranks() const { return dp * tp * pp * cp; }
  bool operator==(const Layout& o) const {
    return dp == o.dp && tp == o.tp && pp == o.pp && cp == o.cp && ep == o.ep;
  }
  std::string text() const;  // "dp 2 x tp 2 x pp 1", then " x cp 2", " (ep 2 of dp)" if > 1
};

// A layout's predicted step time in seconds, or nothing where the model has none for it.
using StepTimeModel = std::function<std::optional<double>(const Layout&)>;

struct Choice {
  Layout layout;
  // Why: "dp shrinks" / "the planner ranks N layouts of R ranks: ..." (for the log).
  std::string why;
};

// The largest layout of at most `cap.ranks()` ranks on `slots`
// slots, for the job `job` (its model and batch; each candidate checked by
// TrainOptions::validate with its dp, tp, pp, cp and ep). `cap`'s tp and pp are where
// shrinking starts; its cp and ep are in every candidate. Nothing when no layout fits.
std::optional<Choice> choose_layout(const train::TrainOptions& job, const Layout& cap, int slots,
                                    const StepTimeModel& model);

// What a job that launch stopped to grow (SIGUSR1: finish the step, save, exit 3) came to.
// A job may take the signal after its last step, when no step is left to stop after: it
// exits 0 or, where the signal came as the process was ending, dies of it. Launch then has
// nothing to grow into: the run is over.
enum class AfterGrowSignal { kGrow, kDone, kFailed };
// `exit_code`: the job's; `last_step`: the step of its newest checkpoint; `steps`: the run's
// --steps.
AfterGrowSignal after_grow_signal(int exit_code, int64_t last_step, int64_t steps);

// The planner's step time for `job` in a layout, on the cluster preset `cluster`
// (plan --cluster: "this-host" as `meshtrain calibrate` measured it, or a cluster file).
// Returns an empty model (never called) when the preset cannot be read, saying why in `why`.
StepTimeModel planner_step_time(const train::TrainOptions& job, const std::string& cluster,
                                std::string* why);

}  // namespace mt::cli::launch

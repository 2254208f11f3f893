// Flags shared by `meshtrain plan` and `meshtrain simulate`: the model (a preset of the
// planner or of `train`, every shape field overridable with train's flags), the cluster,
// the job, and the layout flags of `train` (pins for `plan`, the layout for `simulate`).
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "cli/model_flags.h"
#include "plan/planner.h"

namespace mt::cli {

struct PlanFlags {
  ModelFlags model;
  std::string cluster = "dgx-h100";
  std::optional<int64_t> gpus, batch;
  std::string dtype = "bf16";
  std::optional<int> dp, tp, pp, cp, zero, virtual_stages;
  std::optional<int64_t> microbatch, microbatches;
  std::optional<std::string> schedule, recompute;
  std::optional<std::string> pp_layers;  // "5,7,7,5", as train takes it
  bool sp = false, no_sp = false;
  bool tp_comm_overlap = false;
  bool unfused_attention = false;
  bool unfused_grad_accum = false;
  bool no_dropout = false;
  bool json = false;

  void add_to(CLI::App& app);
  // Refuses a layout flag out of its range (--tp 0, --pp -2, --zero 4) or two that
  // contradict each other, before anything divides by it.
  void check() const;
  plan::Job job() const;
  plan::SearchPins pins() const;
  bool pins_any() const;  // a layout flag was given (plan: the search is narrowed)
};

nlohmann::json estimate_json(const plan::Job& job, const plan::Estimate& e);
nlohmann::json job_json(const plan::Job& job);
// One line per layout: the table `plan` prints and `simulate` starts with.
std::string estimate_table(const std::vector<plan::Estimate>& rows);

}  // namespace mt::cli

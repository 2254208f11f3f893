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
  std::optional<int> dp, tp, pp, cp, ep, zero, virtual_stages;
  std::optional<int> etp;    // Megatron-Core's expert tensor parallelism: 1 or --tp
  double expert_load = 1.0;  // MoE: the busiest expert's load over the mean
  std::optional<int64_t> microbatch, microbatches;
  std::optional<std::string> schedule, recompute;
  std::string cp_comm = "ring";          // how cp ranks exchange keys and values (train --cp-comm)
  std::optional<std::string> pp_layers;  // "5,7,7,5", as train takes it
  bool sp = false, no_sp = false;
  bool tp_comm_overlap = false;
  bool tp_across_hosts = false;  // plan::Layout::tp_across_nodes (train --mesh-order pp,tp,cp,dp)
  bool unfused_attention = false;
  bool unfused_grad_accum = false;
  bool no_dropout = false;
  bool meshtrain_runtime = false;  // Job::our_runtime
  bool json = false;

  void add_to(CLI::App& app);
  // Refuses a shape or layout flag out of its range (--vocab -5, --tp 0, --zero 4), two that
  // contradict each other, and (megatron_2021) what Megatron-LM 2021 did not have, before
  // anything divides by it. Shared by plan and simulate, so both refuse the same flags.
  void check(bool megatron_2021) const;
  void check_megatron_2021() const;
  // Refuses pins that no layout of the job can honour together (--zero 1 where dp is 1,
  // --sp where tp is 1, --schedule interleaved where pp is 1), naming that contradiction.
  void check_pins(const plan::Job& j, bool search) const;
  plan::Job job() const;
  plan::SearchPins pins() const;
  bool pins_any() const;  // a layout flag was given (plan: the search is narrowed)
};

// A parameter count for people: 842K, 124M, 1.5B, 1.01T.
std::string params_text(double n);
nlohmann::json estimate_json(const plan::Job& job, const plan::Estimate& e);
nlohmann::json job_json(const plan::Job& job);
// One line per layout: the table `plan` prints and `simulate` starts with.
std::string estimate_table(const std::vector<plan::Estimate>& rows);

}  // namespace mt::cli

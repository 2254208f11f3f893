// `plan --explain` (issue 30, item 5): one layout's step time as a stacked list — the GEMMs
// by kind, attention, the memory-bound kernels, launch overhead, each exposed communication,
// the pipeline bubble, the DP reduction and the optimizer — on the busiest pipeline rank
// (the one whose work sets the step), so a user sees why the step takes what it takes. The
// items sum to Estimate::step_time_s (docs/planner.md, "Explain").
#pragma once

#include <string>
#include <vector>

#include "plan/planner.h"

namespace mt::plan {

struct StepItem {
  std::string name;  // e.g. "GEMM: MLP in", "TP communication (exposed)", "pipeline bubble"
  double seconds = 0;
};

// The items of `e`, the estimate of `l` for `job` (as estimate() returns it).
std::vector<StepItem> explain(const Job& job, const Estimate& e);
// The list as text: seconds, share of the step and a bar per item, then the step.
std::string explain_text(const std::vector<StepItem>& items, double step_time_s);

}  // namespace mt::plan

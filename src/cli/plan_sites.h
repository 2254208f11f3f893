// `meshtrain plan --sites S`: the best layout's step across S sites joined by a slow link,
// synchronous against DiLoCo (plan/sites.h, docs/diloco.md "The planner").
#pragma once

#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "plan/planner.h"

namespace mt::cli {

struct PlanSitesFlags {
  std::optional<int> sites;
  int64_t every = 50;
  std::string compress = "none";
  std::optional<double> gbps, latency_ms;  // override the cluster's site link

  void add_to(CLI::App& app);
  // With --sites: one line to `human`, and the model's numbers under "sites" in `json`.
  void report(const plan::Job& j, const plan::Estimate& best, FILE* human,
              nlohmann::json* json) const;
};

}  // namespace mt::cli

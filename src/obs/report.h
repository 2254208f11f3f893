// `meshtrain report`: one self-contained HTML page (no server, no network) from runs'
// metrics files (JSON lines, train --metrics), a Chrome trace (train/simulate --trace) and
// a plan or simulate --json: loss against steps and tokens, throughput and MFU, learning
// rate and gradient norm, peak memory per rank by category, bytes per step by mesh
// dimension, the pipeline timeline, predicted against measured, and a mixture of experts'
// routing (docs/report.md).
// The page embeds the data as JSON (`<script id="mt-data">`), uPlot and its own script.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace mt::obs {

struct ReportInput {
  std::vector<std::string> metrics;  // one file per run
  std::vector<std::string> labels;   // one per run; empty: the files' names
  std::string trace;                 // Chrome trace JSON, "" for none
  std::string plan;                  // plan --json or simulate --json output, "" for none
  int plan_layout = 0;               // which of the plan's ranked layouts (0: the best)
  std::string title;
};

// The data the page embeds: each run's columns (arrays aligned with "step", null where a
// row lacks the key), its "run" header and last "memory_by_rank", its rows' "moe" objects
// (aligned with "step"; null for a run without experts); the trace's events; the plan's
// prediction. Refuses unreadable or malformed files (mt::Error, naming file and line).
nlohmann::json report_data(const ReportInput& in);
// The page for that data.
std::string report_html(const nlohmann::json& data);
// The embedded data of a page report_html wrote (for tests and scripts).
nlohmann::json report_data_of_html(const std::string& html);

// `plan --html`: the same page holding a plan --json document (key "ranked"): the ranked
// layouts as a table and their memory and time breakdowns as stacked bars.
std::string plan_html(const nlohmann::json& plan_json, const std::string& title);

// Writes `text` to `path` through a temporary name and a rename; `flag` names the option in
// the error (mt::Error, exit 2).
void write_text_file(const std::string& path, const std::string& text, const char* flag);

}  // namespace mt::obs

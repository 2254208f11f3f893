#include "obs/trace.h"

#include <nlohmann/json.hpp>

#include "core/write_file.h"

namespace mt::obs {

void write_chrome_trace(const std::string& path, const std::vector<TraceEvent>& events,
                        int num_ranks) {
  nlohmann::json list = nlohmann::json::array();
  for (int r = 0; r < num_ranks; ++r)
    list.push_back({{"name", "thread_name"},
                    {"ph", "M"},
                    {"pid", 0},
                    {"tid", r},
                    {"args", {{"name", "rank " + std::to_string(r)}}}});
  for (const TraceEvent& e : events)
    list.push_back({{"name", e.name},
                    {"cat", e.cat},
                    {"ph", "X"},
                    {"pid", 0},
                    {"tid", e.rank},
                    {"ts", e.start_s * 1e6},
                    {"dur", e.dur_s * 1e6}});
  // Complete or not there: a write that fails is an error at once, with no .tmp left.
  io::write_file(path,
                 nlohmann::json{{"traceEvents", list}, {"displayTimeUnit", "ms"}}.dump() + "\n");
}

}  // namespace mt::obs

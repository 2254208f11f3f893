#include "obs/trace.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

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
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    if (!f) fail("cannot write the trace file '{}' (check the directory exists)", path);
    f << nlohmann::json{{"traceEvents", list}, {"displayTimeUnit", "ms"}}.dump() << "\n";
    if (!f) fail("cannot write the trace file '{}'", path);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    fail("cannot rename '{}' to the trace file '{}'", tmp, path);
}

}  // namespace mt::obs

// Chrome / Perfetto trace files (the JSON "traceEvents" format, chrome://tracing and
// ui.perfetto.dev): one row (thread) per rank, one complete event ("ph": "X") per span.
#pragma once

#include <string>
#include <vector>

namespace mt::obs {

struct TraceEvent {
  int rank = 0;        // the row
  std::string name;    // e.g. "F3.1"
  std::string cat;     // forward, backward, weight, send, recv, idle
  double start_s = 0;  // from the start of the trace
  double dur_s = 0;
};

// Writes the events (rows named "rank N"); refuses an unwritable path (mt::Error).
void write_chrome_trace(const std::string& path, const std::vector<TraceEvent>& events,
                        int num_ranks);

}  // namespace mt::obs

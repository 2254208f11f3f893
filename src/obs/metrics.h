// Metrics as JSON lines (one object per step, fixed keys) and the human progress line.
#pragma once

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace mt::obs {

// The rows that a run resumed from the checkpoint of `step` keeps of the metrics file `path`,
// in order: its step rows through `step` and every event row (no step: a supervisor's restart
// record, meshtrain launch). A row that does not parse (the last one of a run killed while
// writing it) is dropped; no file: none.
std::vector<std::string> metrics_rows_through(const std::string& path, int64_t step);

class MetricsWriter {
 public:
  MetricsWriter() = default;
  // "" = off. resumed_at > 0 (a run resumed from the checkpoint of that step): the file's
  // rows of steps up to resumed_at are kept and the new ones appended after them; otherwise
  // the file starts empty.
  explicit MetricsWriter(const std::string& path, int64_t resumed_at = 0);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  // One line, flushed; a write that fails (a full disk, /dev/full) throws mt::Error (a run
  // failure) naming the file.
  void write(const nlohmann::json& row);
  // Flushes and closes, checked the same way (the destructor closes unchecked).
  void close();

 private:
  [[noreturn]] void failed(const char* what);
  std::FILE* file_ = nullptr;
  std::string path_;
};

// A line that rewrites itself on a terminal and prints plain lines otherwise.
class Progress {
 public:
  explicit Progress(std::FILE* out = stderr);
  // Shows `line` as the live status (terminal) — ignored when not a terminal.
  void status(const std::string& line);
  // A permanent line (clears a live status first).
  void line(const std::string& line);
  bool is_terminal() const { return tty_; }

 private:
  std::FILE* out_;
  bool tty_;
  bool live_ = false;
};

std::string human_bytes(double bytes);

}  // namespace mt::obs

#include "obs/metrics.h"

#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "core/error.h"

namespace mt::obs {

namespace {

// The rows of `path` whose step is at most `step`, in order. A row that does not parse (the
// last one of a run killed while writing it) or has no step is dropped.
std::vector<std::string> rows_through(const std::string& path, int64_t step) {
  std::vector<std::string> kept;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (row.is_object() && row.contains("step") && row["step"].is_number_integer() &&
        row["step"].get<int64_t>() <= step)
      kept.push_back(line);
  }
  return kept;
}

}  // namespace

MetricsWriter::MetricsWriter(const std::string& path, int64_t resumed_at) {
  if (path.empty()) return;
  // Only a regular file is read back and rewritten: /dev/stdout or a pipe is appended to.
  std::error_code ec;
  const bool regular = std::filesystem::is_regular_file(path, ec);
  const std::vector<std::string> kept =
      resumed_at > 0 && regular ? rows_through(path, resumed_at) : std::vector<std::string>{};
  if (!regular && std::filesystem::exists(path, ec)) {
    file_ = std::fopen(path.c_str(), "a");
  } else if (kept.empty()) {
    file_ = std::fopen(path.c_str(), "w");
  } else {
    // The kept rows replace the file whole (a crash now leaves the old file, not half of it).
    const std::string tmp = path + ".tmp";
    if (std::FILE* out = std::fopen(tmp.c_str(), "w")) {
      for (const std::string& row : kept) std::fprintf(out, "%s\n", row.c_str());
      const bool ok = std::fclose(out) == 0;
      if (ok && std::rename(tmp.c_str(), path.c_str()) == 0) file_ = std::fopen(path.c_str(), "a");
    }
  }
  if (!file_) fail("cannot write metrics file '{}' (does the directory exist?)", path);
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::write(const nlohmann::json& row) {
  if (!file_) return;
  std::fputs(row.dump().c_str(), file_);
  std::fputc('\n', file_);
  std::fflush(file_);
}

Progress::Progress(std::FILE* out) : out_(out), tty_(::isatty(fileno(out)) != 0) {}

void Progress::status(const std::string& line) {
  if (!tty_) return;
  std::fprintf(out_, "\r\033[K%s", line.c_str());
  std::fflush(out_);
  live_ = true;
}

void Progress::line(const std::string& line) {
  if (live_) std::fputs("\r\033[K", out_);
  live_ = false;
  std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) bytes /= 1024, ++u;
  return fmt::format("{:.1f} {}", bytes, units[u]);
}

}  // namespace mt::obs

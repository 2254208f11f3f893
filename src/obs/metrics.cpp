#include "obs/metrics.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/error.h"
#include "core/write_file.h"

namespace mt::obs {

std::vector<std::string> metrics_rows_through(const std::string& path, int64_t step) {
  std::vector<std::string> kept;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (row.is_object() && ((row.contains("step") && row["step"].is_number_integer() &&
                             row["step"].get<int64_t>() <= step) ||
                            (!row.contains("step") && row.contains("event"))))
      kept.push_back(line);
  }
  return kept;
}

MetricsWriter::MetricsWriter(const std::string& path, int64_t resumed_at) {
  if (path.empty()) return;
  // Only a regular file is read back and rewritten: /dev/stdout or a pipe is appended to.
  std::error_code ec;
  const bool regular = std::filesystem::is_regular_file(path, ec);
  const std::vector<std::string> kept = resumed_at > 0 && regular
                                            ? metrics_rows_through(path, resumed_at)
                                            : std::vector<std::string>{};
  if (!regular && std::filesystem::exists(path, ec)) {
    file_ = std::fopen(path.c_str(), "a");
  } else if (kept.empty()) {
    file_ = std::fopen(path.c_str(), "w");
  } else {
    // The kept rows replace the file whole (a crash now leaves the old file, not half of it;
    // a full disk is an error now).
    std::string text;
    for (const std::string& row : kept) text += row + "\n";
    io::write_file(path, text);
    file_ = std::fopen(path.c_str(), "a");
  }
  if (!file_)
    fail("cannot write metrics file '{}': {} (does the directory exist?)", path,
         std::strerror(errno));
  path_ = path;
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::write(const nlohmann::json& row) {
  if (!file_) return;
  const std::string line = row.dump() + "\n";
  // Every row reaches the file now, or the run stops now: a full disk (or /dev/full) must not
  // lose a run's metrics silently.
  errno = 0;
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0 ||
      std::ferror(file_))
    failed("writing");
}

void MetricsWriter::close() {
  if (!file_) return;
  errno = 0;
  const bool flushed = std::fflush(file_) == 0 && !std::ferror(file_);
  const int flush_err = errno;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!flushed) {
    errno = flush_err;
    failed("writing");
  }
  if (!closed) failed("closing");
}

void MetricsWriter::failed(const char* what) {
  const int err = errno;
  fail_run("{} the metrics file '{}' failed: {}{}", what, path_,
           err ? std::strerror(err) : "an I/O error",
           err == ENOSPC || err == EDQUOT ? " (the disk is full: free space or write --metrics "
                                            "elsewhere)"
                                          : "");
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

#include "obs/metrics.h"

#include <unistd.h>

#include <fmt/format.h>

#include "core/error.h"

namespace mt::obs {

MetricsWriter::MetricsWriter(const std::string& path) {
  if (path.empty()) return;
  file_ = std::fopen(path.c_str(), "w");
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

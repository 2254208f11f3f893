#include "obs/run_info.h"

#include <unistd.h>

#include <array>
#include <ctime>
#include <fstream>
#include <mutex>

namespace mt::obs {

// Generated (build/.../generated/git_commit.cpp) and linked into the meshtrain executable
// only, so that a new commit relinks one binary rather than every test: weak, and null in
// the test executables.
extern const char* const kGitCommit __attribute__((weak));

namespace {
std::mutex mu;
std::string recorded;

// Quotes a word for a POSIX shell when it holds anything but safe characters.
std::string quote(const std::string& w) {
  if (!w.empty() && w.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789-_./=:,+@%") == std::string::npos)
    return w;
  std::string q = "'";
  for (char c : w) {
    if (c == '\'')
      q += "'\\''";
    else
      q += c;
  }
  return q + "'";
}
}  // namespace

void set_command_line(int argc, const char* const* argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) {
    if (i) s += ' ';
    s += quote(argv[i]);
  }
  std::lock_guard<std::mutex> lock(mu);
  recorded = s;
}

std::string command_line() {
  std::lock_guard<std::mutex> lock(mu);
  return recorded;
}

std::string git_commit() {
  const char* const* commit = &kGitCommit;
  return commit && (*commit)[0] ? *commit : "unknown";
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos && colon + 2 <= line.size()) return line.substr(colon + 2);
    }
  return "unknown";
}

std::string host_name() {
  std::array<char, 256> buf{};
  if (::gethostname(buf.data(), buf.size() - 1) != 0) return "unknown";
  return buf.data();
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  std::array<char, 32> buf{};
  std::strftime(buf.data(), buf.size(), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf.data();
}

}  // namespace mt::obs

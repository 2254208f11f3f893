// Runs a command (a child job that is expected to fail) and returns its exit code, its
// combined output and how long it took.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/clock.h"

namespace mt::comm::testing {

struct ChildResult {
  int exit_code = -1;
  std::string output;
  double time_s = 0;
};

inline ChildResult run_child(const std::string& command) {
  ChildResult r;
  double t0 = now_s();
  FILE* f = popen((command + " 2>&1").c_str(), "r");
  if (!f) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) r.output.append(buf, n);
  int status = pclose(f);
  r.time_s = now_s() - t0;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

inline std::string self_exe() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return std::string(buf, n > 0 ? static_cast<size_t>(n) : 0);
}

}  // namespace mt::comm::testing

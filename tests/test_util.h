// Helpers shared by tests: a scratch directory, the demo text as tokens, and running the
// meshtrain binary as a user would (exit code and output).
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "train/token_file.h"

namespace mt::test {

// An integer from the environment (mpirun's OMPI_COMM_WORLD_SIZE / _RANK), or `fallback`.
inline int env_int(const char* name, int fallback) {
  const char* s = std::getenv(name);
  return s ? std::atoi(s) : fallback;
}

// The scratch directories this process made, removed when it ends if every test passed (a
// failed test's files stay for a look; left behind they once filled a disk: 20,000 of them,
// 65 GB). Only by the process that made them: a forked child that exits removes nothing.
struct ScratchDirs {
  std::vector<std::filesystem::path> dirs;
  pid_t owner = ::getpid();
  ~ScratchDirs() {
    if (::getpid() != owner || !::testing::UnitTest::GetInstance()->Passed()) return;
    for (const auto& d : dirs) {
      std::error_code ec;
      std::filesystem::remove_all(d, ec);
    }
  }
};

inline std::filesystem::path scratch_dir(const std::string& name) {
  static ScratchDirs made;
  auto dir = std::filesystem::temp_directory_path() /
             ("meshtrain-test-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  made.dirs.push_back(dir);
  return dir;
}

// The byte-level demo text: the licence texts every Debian system ships.
inline std::string demo_tokens(const std::filesystem::path& dir) {
  std::vector<uint16_t> tokens;
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator("/usr/share/common-licenses"))
    if (e.is_regular_file()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (unsigned char ch : text) tokens.push_back(ch);
  }
  const std::string path = (dir / "demo.bin").string();
  train::write_token_file(path, tokens);
  return path;
}

struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

inline RunResult run_command(const std::string& cmd) {
  RunResult r;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

inline RunResult run_meshtrain(const std::string& args) {
  return run_command(std::string(MT_BINARY) + " " + args);
}

// `mpirun -np N` as root and past the cores, for run_command: "<prefix>meshtrain args". Leak
// checking is off in its processes (sanitizer builds, make sanitize): Open MPI leaves its own
// allocations at exit in plugins it has unloaded ("<unknown module>", which no suppression can
// name), so LeakSanitizer would fail every process on Open MPI's account. Address and UB
// checks stay on (with the caller's ASAN_OPTIONS, e.g. make sanitize's
// detect_stack_use_after_return), and leak checking stays on in every run outside mpirun.
inline std::string mpirun(int np) {
  return "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
         "OMPI_MCA_rmaps_base_oversubscribe=1 ASAN_OPTIONS=\"$ASAN_OPTIONS:detect_leaks=0\" "
         "mpirun -np " +
         std::to_string(np) + " --oversubscribe ";
}

inline RunResult run_mpirun(int np, const std::string& args) {
  return run_command(mpirun(np) + MT_BINARY + " " + args);
}

}  // namespace mt::test

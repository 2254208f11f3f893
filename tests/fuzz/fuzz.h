// Fuzz harnesses of the readers of outside files (docs/fuzzing.md). A harness is one file,
// tests/fuzz/READER_fuzz.cpp, with a seed corpus in tests/fuzz/corpus/READER/:
//
//   MT_FUZZ_TARGET(token_file) {   // `bytes`: the fuzzer's input, the file's whole content
//     const std::string path = fuzz::write_input("tokens.bin", bytes);
//     fuzz::read_or_refuse(path, [&] { train::TokenFile f(path, 50257); });
//   }
//
// With MESHTRAIN_FUZZ=ON (clang) it is the libFuzzer target fuzz_READER; in every build it is
// also registered with fuzz_replay_test, which runs it over its seed corpus in CI.
//
// The contract a reader keeps: a malformed file is refused with an mt::Error of exit code 2
// (bad input) whose message names the file. Anything else is a bug, reported by throwing
// fuzz::Bug out of the harness (libFuzzer: a crash, input saved; replay test: a failure): an
// internal assertion (MT_ASSERT), another exit code, a message without the file, any other
// exception. A crash, an over-read or undefined behaviour stops the process under the
// sanitizers; libFuzzer's -malloc_limit_mb catches a reader allocating what the file claims
// and -timeout a hang.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>

#include "core/error.h"

namespace mt::fuzz {

struct Bug : std::logic_error {
  using std::logic_error::logic_error;
};

// This process's scratch directory (on tmpfs where there is one), removed at exit.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path base = fs::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK) == 0
                              ? fs::path("/dev/shm")
                              : fs::temp_directory_path();
    fs::path d = base / ("meshtrain-fuzz-" + std::to_string(::getpid()));
    fs::remove_all(d, ec);
    fs::create_directories(d);
    std::atexit([] {
      std::error_code ignored;
      fs::remove_all(scratch_dir(), ignored);
    });
    return d;
  }();
  return dir;
}

// Writes `bytes` as the file `path` (replacing it).
inline void write_file(const std::string& path, std::string_view bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("fuzz: cannot write " + path);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n <= 0) {
      ::close(fd);
      throw std::runtime_error("fuzz: write to " + path + " failed");
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
}

// The input as the file `name` in the scratch directory; returns its path.
inline std::string write_input(const std::string& name, std::string_view bytes) {
  const std::string path = (scratch_dir() / name).string();
  write_file(path, bytes);
  return path;
}

// A refusal is the expected answer to a malformed file: an mt::Error of exit code 2 whose
// message names `file` (empty: any message). Anything else is a Bug.
inline void check_refusal(const Error& e, const std::string& file) {
  const std::string what = e.what();
  if (what.rfind("internal error", 0) == 0)
    throw Bug("an internal assertion fired instead of a refusal: " + what);
  if (e.code() != ExitCode::kBadInput)
    throw Bug("a refusal with exit code " + std::to_string(e.exit_code()) +
              " instead of 2 (bad input): " + what);
  if (!file.empty() && what.find(file) == std::string::npos)
    throw Bug("a refusal that does not name the file '" + file + "': " + what);
}

// Runs `read`; returns true when it read the file, false when it refused it properly.
template <class F>
bool read_or_refuse(const std::string& file, F&& read) {
  try {
    read();
    return true;
  } catch (const Error& e) {
    check_refusal(e, file);
    return false;
  }
}

using Target = void (*)(std::string_view bytes);

// The harnesses linked into this program, by reader name (fuzz_replay_test).
inline std::map<std::string, Target>& targets() {
  static std::map<std::string, Target> all;
  return all;
}
inline bool register_target(const char* name, Target fn) {
  targets()[name] = fn;
  return true;
}

}  // namespace mt::fuzz

#ifdef MT_FUZZ_LIBFUZZER
#define MT_FUZZ_TARGET(name)                                                         \
  static void mt_fuzz_one_##name(std::string_view bytes);                            \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {          \
    mt_fuzz_one_##name(std::string_view(reinterpret_cast<const char*>(data), size)); \
    return 0;                                                                        \
  }                                                                                  \
  static void mt_fuzz_one_##name(std::string_view bytes)
#else
#define MT_FUZZ_TARGET(name)                                     \
  static void mt_fuzz_one_##name(std::string_view bytes);        \
  [[maybe_unused]] static const bool mt_fuzz_registered_##name = \
      ::mt::fuzz::register_target(#name, mt_fuzz_one_##name);    \
  static void mt_fuzz_one_##name(std::string_view bytes)
#endif

// One exception type for the whole project. Its message says what is wrong, the value,
// and the fix. Its exit code says whether the input was bad (2, found before any work) or
// the run failed (1: NaN loss, a dead rank, a timeout); 3 is a training run stopped on
// request (a signal: the step finished, the checkpoint saved).
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace mt {

enum class ExitCode : int { kOk = 0, kRunFailure = 1, kBadInput = 2, kStopped = 3 };

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, ExitCode code = ExitCode::kBadInput)
      : std::runtime_error(message), code_(code) {}
  ExitCode code() const { return code_; }
  int exit_code() const { return static_cast<int>(code_); }

 private:
  ExitCode code_;
};

// Bad input: refuse before any work.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...), ExitCode::kBadInput);
}

// A failure while running.
template <typename... Args>
[[noreturn]] void fail_run(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...), ExitCode::kRunFailure);
}

}  // namespace mt

// Internal invariant (a bug if it fires, not a user error).
#define MT_ASSERT(cond)                                                                       \
  do {                                                                                        \
    if (!(cond))                                                                              \
      throw ::mt::Error(fmt::format("internal error: {} ({}:{})", #cond, __FILE__, __LINE__), \
                        ::mt::ExitCode::kRunFailure);                                         \
  } while (0)

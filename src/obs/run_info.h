// Where and how a run ran, for the first row of its metrics file (key "run") and the
// header of `meshtrain report`: the command line, the build's commit, the machine.
#pragma once

#include <string>

namespace mt::obs {

// main() records argv once; command_line() is it shell-quoted ("" when never set).
void set_command_line(int argc, const char* const* argv);
std::string command_line();
// The commit the binary was built from: `git describe --always --dirty` at build time
// (cmake/git_commit.cmake), "unknown" outside a git checkout and in the test executables
// (only `meshtrain` links the generated commit).
std::string git_commit();
std::string cpu_model();  // /proc/cpuinfo's "model name", "unknown" when absent
std::string host_name();
std::string utc_now();  // ISO 8601, seconds, e.g. 2026-11-27T03:30:00Z

}  // namespace mt::obs

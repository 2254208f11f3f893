// Processes for `meshtrain launch` (cli/launch.cpp): the job (mpirun) in a process group of
// its own with its stderr read by the launcher line by line, and short commands (a host's
// probe or fence) run with a deadline. POSIX only (posix_spawn).
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

namespace mt::cli::launch {

// A child started with posix_spawnp in a new process group (so that it and everything it
// starts can be signalled together); its stdout is ours, its stderr a pipe.
class Job {
 public:
  // Throws mt::Error (bad input) naming argv[0] when it cannot be started.
  explicit Job(const std::vector<std::string>& argv);
  ~Job();  // kills the group if it still runs
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;
  // Waits up to `wait_s` for output; passes each complete line of the child's stderr (and a
  // last unterminated one at its end) to `line`. Returns false once the child has exited and
  // its stderr is drained; then exit_code() holds its status (128 + signal when killed).
  bool pump(double wait_s, const std::function<void(const std::string&)>& line);
  void signal(int sig);  // to the child alone (mpirun: it forwards SIGUSR1 to the ranks)
  void kill_group();     // SIGKILL to its whole process group
  int exit_code() const { return code_; }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  int code_ = -1;
  bool exited_ = false;
  std::string partial_;
};

// Runs `command HOST` through /bin/sh; true when it exits 0 within `timeout_s` (else it is
// killed and counts as false). Its output is discarded.
bool run_for_host(const std::string& command, const std::string& host, double timeout_s);

// This process's own executable (/proc/self/exe), to run `train` with the same binary.
std::string self_executable();

}  // namespace mt::cli::launch

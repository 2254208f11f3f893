#include "cli/launch_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "core/error.h"

extern char** environ;

namespace mt::cli::launch {

namespace {

int status_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// posix_spawnp with a new process group, stdout kept, stdin from /dev/null, stderr to
// `err_fd` (-1: to /dev/null too).
pid_t spawn(const std::vector<std::string>& argv, int err_fd, int close_fd) {
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t at;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&at);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  if (err_fd >= 0) {
    posix_spawn_file_actions_adddup2(&fa, err_fd, 2);
  } else {
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  }
  if (close_fd >= 0) posix_spawn_file_actions_addclose(&fa, close_fd);
  posix_spawnattr_setpgroup(&at, 0);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&at, &none);
  sigset_t dflt;
  sigemptyset(&dflt);
  for (int s : {SIGINT, SIGTERM, SIGUSR1, SIGPIPE, SIGCHLD}) sigaddset(&dflt, s);
  posix_spawnattr_setsigdefault(&at, &dflt);
  posix_spawnattr_setflags(&at,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, args[0], &fa, &at, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  if (rc != 0)
    fail("cannot start '{}': {} (is it installed and on PATH?)", argv[0], std::strerror(rc));
  return pid;
}

}  // namespace

Job::Job(const std::vector<std::string>& argv) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0)
    fail_run("cannot make a pipe for the job: {}", std::strerror(errno));
  try {
    pid_ = spawn(argv, p[1], p[0]);
  } catch (...) {
    close(p[0]);
    close(p[1]);
    throw;
  }
  close(p[1]);
  fd_ = p[0];
}

Job::~Job() {
  if (!exited_ && pid_ > 0) {
    kill_group();
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  if (fd_ >= 0) close(fd_);
}

bool Job::pump(double wait_s, const std::function<void(const std::string&)>& line) {
  if (fd_ >= 0) {
    pollfd pfd{fd_, POLLIN, 0};
    const int n = poll(&pfd, 1, static_cast<int>(wait_s * 1000));
    if (n > 0) {
      char buf[65536];
      const ssize_t got = read(fd_, buf, sizeof buf);
      if (got > 0) {
        partial_.append(buf, static_cast<size_t>(got));
        for (size_t at; (at = partial_.find('\n')) != std::string::npos;) {
          line(partial_.substr(0, at));
          partial_.erase(0, at + 1);
        }
      } else if (got == 0) {  // every writer closed: the job and what it started are gone
        if (!partial_.empty()) line(partial_);
        partial_.clear();
        close(fd_);
        fd_ = -1;
      }
    }
  } else {
    std::this_thread::sleep_for(std::chrono::duration<double>(wait_s));
  }
  if (!exited_) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      exited_ = true;
      code_ = status_code(status);
    }
  }
  // Done once mpirun has exited; its stderr may stay open in a stray child of a lost host's
  // daemon, which is not waited for.
  if (exited_ && fd_ >= 0) {
    pollfd pfd{fd_, POLLIN, 0};
    if (poll(&pfd, 1, 0) > 0) return true;  // drain what is there first
  }
  return !exited_;
}

void Job::signal(int sig) {
  if (!exited_ && pid_ > 0) ::kill(pid_, sig);
}

void Job::kill_group() {
  if (pid_ > 0) ::kill(-pid_, SIGKILL);
}

bool run_for_host(const std::string& command, const std::string& host, double timeout_s) {
  const pid_t pid = spawn({"/bin/sh", "-c", command + " \"$0\"", host}, -1, -1);
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > end) {
      ::kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

std::string self_executable() {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("meshtrain") : p.string();
}

}  // namespace mt::cli::launch

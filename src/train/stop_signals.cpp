#include "train/stop_signals.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>
#include <ctime>
#include <thread>

namespace mt::train {

namespace {

constexpr int kSignals[] = {SIGINT, SIGTERM, SIGUSR1};

std::atomic<int> g_requested{0};
std::atomic<int> g_installs{0};

void say(const char* text) {
  [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, text, std::strlen(text));
}

// The signals are blocked in every thread of the process (the mask is set before any rank,
// MPI or OpenMP thread exists, and threads inherit it) and taken by this one thread with
// sigtimedwait: no handler ever interrupts a thread in the middle of its work (an
// asynchronous handler on whichever thread the kernel picks, an MPI progress thread among
// them, corrupted Open MPI's state now and then).
class Waiter {
 public:
  Waiter(const sigset_t& set, bool announce) : set_(set), announce_(announce) {
    thread_ = std::thread([this] { run(); });
  }
  ~Waiter() {
    stop_ = true;
    thread_.join();
  }

 private:
  void run() {
    const timespec tick{0, 50'000'000};  // 50 ms: how soon the destructor is noticed
    while (!stop_) {
      const int signo = ::sigtimedwait(&set_, nullptr, &tick);
      if (signo <= 0) continue;
      int none = 0;
      if (g_requested.compare_exchange_strong(none, signo)) {
        if (announce_)
          say(signo == SIGINT ? "\nmeshtrain: SIGINT: finishing the current step, then "
                                "checkpoint and exit (send it again to stop at once)\n"
              : signo == SIGTERM
                  ? "meshtrain: SIGTERM: finishing the current step, then checkpoint and exit "
                    "(send it again to stop at once)\n"
                  : "meshtrain: SIGUSR1: finishing the current step, then checkpoint and exit "
                    "(send a signal again to stop at once)\n");
        continue;
      }
      // The second: the signal's default action (the process ends, status 128 + signo).
      say("meshtrain: a second signal: stopping at once (no checkpoint)\n");
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      sigemptyset(&dfl.sa_mask);
      ::sigaction(signo, &dfl, nullptr);
      sigset_t one;
      sigemptyset(&one);
      sigaddset(&one, signo);
      ::pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
      ::raise(signo);
    }
  }

  sigset_t set_;
  bool announce_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

Waiter* g_waiter = nullptr;
sigset_t g_blocked, g_old_mask;

}  // namespace

StopSignals::StopSignals(bool announce) {
  // One set per process: a nested run (a test's) shares the outer one's.
  if (g_installs.fetch_add(1) != 0) return;
  installed_ = true;
  g_requested.store(0);
  sigemptyset(&g_blocked);
  for (int s : kSignals) {
    struct sigaction now {};
    ::sigaction(s, nullptr, &now);
    // A signal ignored on entry stays ignored, as the shell meant (a job started with `&`
    // from a script ignores SIGINT: the script's Ctrl-C is not for it).
    if (now.sa_handler != SIG_IGN) sigaddset(&g_blocked, s);
  }
  ::pthread_sigmask(SIG_BLOCK, &g_blocked, &g_old_mask);
  g_waiter = new Waiter(g_blocked, announce);
}

StopSignals::~StopSignals() {
  if (installed_) {
    delete g_waiter;
    g_waiter = nullptr;
    // This thread's mask as it was (a signal that came after the waiter stopped is delivered
    // now, with its default action).
    ::pthread_sigmask(SIG_SETMASK, &g_old_mask, nullptr);
  }
  g_installs.fetch_sub(1);
}

int StopSignals::requested() { return g_requested.load(); }

std::string signal_name(int signo) {
  switch (signo) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGUSR1:
      return "SIGUSR1";
    default:
      return "signal " + std::to_string(signo);
  }
}

}  // namespace mt::train

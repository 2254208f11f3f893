// A clean stop on a signal (docs/checkpoints.md, "Stopping a run"): SIGINT, SIGTERM and
// SIGUSR1 (what schedulers send before a time limit) ask the training loop to stop. The
// loop agrees on it at the next step boundary on every rank (the flag travels in the
// step's scalar all-reduce, so every rank of every layout stops after the same step),
// finishes that step, saves a checkpoint when --checkpoint-dir is set, flushes the metrics
// and exits with ExitCode::kStopped (3). A second signal ends the process at once, as the
// signal's default action does (exit status 128 + the signal's number).
#pragma once

#include <string>

namespace mt::train {

// While one lives, the three signals are blocked in every thread made after it and taken by
// a thread of its own (sigtimedwait), which sets a process-wide flag (a signal ignored on
// entry stays ignored); the signal mask is restored when it goes. Construct it before any
// other thread exists (before MPI_Init, before the rank threads). `announce`: this process prints
// the one-line notice when the first signal comes (rank 0's process).
class StopSignals {
 public:
  explicit StopSignals(bool announce);
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first signal received since construction (0: none).
  static int requested();

 private:
  bool installed_ = false;
};

// "SIGTERM" for SIGTERM, ...; "signal N" for another.
std::string signal_name(int signo);

}  // namespace mt::train

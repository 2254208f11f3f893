// The job of one launch, as seen from this process: its ranks (all of them for `local`,
// one for `mpi`), the groups they made, the watchdog that ends the job when an op stays
// not done past the timeout, and abort (local: every waiting op of every rank throws;
// mpi: MPI_Abort after printing the diagnosis).
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/group.h"

namespace mt::comm {

class Job {
 public:
  explicit Job(double timeout_s) : timeout_s_(timeout_s) {}
  virtual ~Job();

  double timeout_s() const { return timeout_s_; }
  void add_rank(std::shared_ptr<RankContext> rank);
  void register_group(const std::string& name, const std::vector<int>& world_ranks);
  std::vector<int> group_members(const std::string& name) const;

  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  std::string abort_reason() const;
  // Ends the job. Local: marks it aborted and wakes every waiting op (they throw `reason`).
  // The first reason wins. Subclasses (mpi) end the process.
  virtual void abort(const std::string& reason);
  // A rank unwinds an exception while one of its async ops still runs (its buffers are about
  // to be freed, comm::Group's handle waits for the op): ends the job so that the op ends,
  // noting that rank `world_rank`'s own error is the job's (launch reports it, not this
  // reason). False where ending the job would lose that error (mpi: MPI_Abort ends the
  // process); the caller does not wait then.
  virtual bool abort_unwinding(int world_rank);
  // The rank whose unwinding aborted the job (abort_unwinding), or -1.
  int unwinding_rank() const;
  // The watchdog's explanation of `stuck` on `rank` (a multi-line text).
  virtual std::string diagnose(const RankContext& rank, const OpRecord& stuck);
  // Called with the job's mutex free whenever abort() fires (wake waiters).
  virtual void on_abort() {}
  // Extra actions of abort(), after on_abort(): the nccl backend aborts its communicators so
  // that kernels waiting for a dead or stuck peer end. Runs at once if the job is already
  // aborted. remove_abort_hook returns after a running hook finished (safe to destroy what
  // it uses).
  int add_abort_hook(std::function<void()> hook);
  void remove_abort_hook(int id);
  // Extra wait before this process's watchdog fires, so that with one process per rank the
  // lowest stuck rank speaks first and the others do not repeat the diagnosis.
  virtual double watchdog_delay_s() const { return 0; }

  void start_watchdog();
  void stop_watchdog();

 protected:
  // What world rank `r` is doing, from its recorder: "is in all_reduce #3 on dp[0] (...)".
  // Local jobs know every rank; the mpi job asks the others.
  virtual std::string rank_activity(int world_rank, const std::string& group, int64_t seq,
                                    OpType op, bool* arrived, bool* differs);
  std::shared_ptr<RankContext> rank_context(int world_rank) const;
  std::string base_diagnosis(const RankContext& rank, const OpRecord& stuck);

  double timeout_s_;
  mutable std::mutex mu_;
  std::map<int, std::shared_ptr<RankContext>> ranks_;
  std::map<std::string, std::vector<int>> groups_;
  std::atomic<bool> aborted_{false};
  std::string reason_;
  int unwinding_rank_ = -1;

 private:
  void watchdog_loop();
  void run_abort_hooks();
  std::mutex hooks_mu_;
  std::map<int, std::function<void()>> hooks_;
  int next_hook_ = 1;
  std::thread watchdog_;
  std::mutex wd_mu_;
  std::condition_variable wd_cv_;
  bool wd_stop_ = false;
};

}  // namespace mt::comm

// The `local` backend: ranks are threads of one process and collectives go through shared
// memory. Each collective is a reduce-scatter in which every rank reduces its own chunk
// (reading it from every rank's buffer, in rank order: bitwise deterministic) followed by
// an all-gather of the reduced chunks, so each rank moves exactly the ring algorithm's
// volume (docs/comm.md).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/job.h"

namespace mt::comm {

struct LocalShared;

class LocalJob : public Job {
 public:
  // spin_s: how long a rank waiting in a collective spins before it sleeps (LaunchOptions's
  // threads_per_rank decides it; 0: a few hundred pauses only).
  LocalJob(int world_size, double timeout_s, double spin_s = 0);
  ~LocalJob() override;
  int world_size() const { return world_size_; }
  double spin_s() const { return spin_s_; }
  // The shared state of a group, created by the first of its ranks to ask for `key`.
  std::shared_ptr<LocalShared> shared(const std::string& key, const std::string& name,
                                      const std::vector<int>& world_ranks);
  void on_abort() override;

 private:
  int world_size_;
  double spin_s_;
  std::mutex reg_mu_;
  std::map<std::string, std::shared_ptr<LocalShared>> shared_;
};

// Rank `rank` of the group whose shared state is `shared`.
std::unique_ptr<Backend> make_local_backend(LocalJob& job, std::shared_ptr<LocalShared> shared,
                                            int rank);

}  // namespace mt::comm

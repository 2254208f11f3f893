#include "comm/mpi_job.h"

#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "comm/hosts.h"
#include "core/error.h"

namespace mt::comm {

namespace {

constexpr int kTagRequest = 1;
constexpr int kTagReply = 2;
constexpr int kTagNotice = 3;  // why the job ends: printed by the rank that gets it
constexpr int kHostNameBytes = 64;

// --- the job: one rank per process; abort = MPI_Abort after the diagnosis.

class MpiJob : public Job {
 public:
  MpiJob(double timeout_s, int rank) : Job(timeout_s), rank_(rank) {
    MPI_Comm_dup(MPI_COMM_WORLD, &svc_);
    int size = 1;
    MPI_Comm_size(svc_, &size);
    // Every rank's host name, for the diagnosis ("host mt-h3 (ranks 6, 7) did not answer").
    std::string mine = this_host_name();
    mine.resize(kHostNameBytes - 1);
    std::vector<char> all(static_cast<size_t>(kHostNameBytes * size));
    MPI_Allgather(mine.c_str(), kHostNameBytes, MPI_CHAR, all.data(), kHostNameBytes, MPI_CHAR,
                  svc_);
    for (int r = 0; r < size; ++r)
      host_.emplace_back(&all[static_cast<size_t>(r * kHostNameBytes)]);
    service_ = std::thread([this] { serve(); });
  }
  ~MpiJob() override {
    stop_watchdog();
    stop_ = true;
    service_.join();
    MPI_Comm_free(&svc_);
  }
  void abort(const std::string& reason) override {
    std::fprintf(stderr, "%s\n", reason.c_str());
    std::fflush(stderr);
    notify_survivors();
    MPI_Abort(MPI_COMM_WORLD, static_cast<int>(ExitCode::kRunFailure));
    std::_Exit(static_cast<int>(ExitCode::kRunFailure));
  }
  // MPI_Abort would end the process before the rank's own error is printed (launch_mpi does).
  bool abort_unwinding(int) override { return false; }
  double watchdog_delay_s() const override { return 0.5 * std::min(rank_, 6); }
  std::string diagnose(const RankContext& rank, const OpRecord& stuck) override {
    // Ask every member of the group (or the peer) what it is doing; the others' service
    // threads answer even while their main threads are blocked in MPI.
    // Every rank is asked (not only the group's): the ones that do not answer name the hosts
    // that are lost or cut off.
    std::vector<int> members(host_.size());
    for (size_t r = 0; r < members.size(); ++r) members[r] = static_cast<int>(r);
    std::string req = fmt::format("{}\n{}\n{}", stuck.group, stuck.seq, static_cast<int>(stuck.op));
    if (!is_collective(stuck.op)) req = fmt::format("\n0\n{}", static_cast<int>(stuck.op));
    std::vector<MPI_Request> sends;
    for (int r : members)
      if (r >= 0 && r != rank_) {
        sends.emplace_back();
        MPI_Isend(req.data(), static_cast<int>(req.size()), MPI_CHAR, r, kTagRequest, svc_,
                  &sends.back());
      }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    size_t want = sends.size();
    while (replies_.size() < want && std::chrono::steady_clock::now() < deadline) {
      int flag = 0;
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, kTagReply, svc_, &flag, &st);
      if (!flag) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        continue;
      }
      int len = 0;
      MPI_Get_count(&st, MPI_CHAR, &len);
      std::string s(static_cast<size_t>(len), '\0');
      MPI_Recv(s.data(), len, MPI_CHAR, st.MPI_SOURCE, kTagReply, svc_, MPI_STATUS_IGNORE);
      replies_[st.MPI_SOURCE] = s;
    }
    lost_ = lost_hosts();
    std::string d = base_diagnosis(rank, stuck);
    if (!lost_.empty()) d += "\n  " + lost_;
    return d;
  }

 protected:
  std::string rank_activity(int world_rank, const std::string& group, int64_t seq, OpType op,
                            bool* arrived, bool* differs) override {
    if (world_rank == rank_)
      return Job::rank_activity(world_rank, group, seq, op, arrived, differs);
    *arrived = *differs = false;
    auto it = replies_.find(world_rank);
    if (it == replies_.end())
      return fmt::format(
          "did not answer within 2 s (its process is dead or not calling MPI; host {})",
          host_of(world_rank));
    *arrived = it->second[0] == '1';
    *differs = it->second[1] == '1';
    return it->second.substr(2);
  }

 private:
  std::string host_of(int world_rank) const {
    return world_rank >= 0 && world_rank < static_cast<int>(host_.size())
               ? host_[static_cast<size_t>(world_rank)]
               : "?";
  }

  // "lost hosts (no rank there answered): mt-h3 (ranks 6, 7)", or "" when every host has a
  // rank that answered (one dead process is not a lost host). Needs diagnose()'s replies.
  std::string lost_hosts() const {
    std::map<std::string, std::vector<int>> silent, all;
    for (int r = 0; r < static_cast<int>(host_.size()); ++r) {
      all[host_of(r)].push_back(r);
      if (r != rank_ && !replies_.count(r)) silent[host_of(r)].push_back(r);
    }
    std::string s;
    for (const auto& [host, ranks] : silent) {
      if (ranks.size() != all[host].size()) continue;
      std::string list;
      for (int r : ranks) list += (list.empty() ? "" : ", ") + std::to_string(r);
      s += fmt::format("{}{} (ranks {})", s.empty() ? "" : "; ", host, list);
    }
    return s.empty() ? s : "lost hosts (no rank there answered): " + s;
  }

  // Before MPI_Abort: every rank that answered prints why the job ends (its own log names
  // the lost hosts too). Waits at most 1 s for the notices to leave.
  void notify_survivors() {
    if (replies_.empty()) return;
    const std::string note =
        fmt::format("comm watchdog of rank {} (host {}) ends the job{}", rank_, host_of(rank_),
                    lost_.empty() ? std::string() : ": " + lost_);
    std::vector<MPI_Request> reqs;
    for (const auto& [r, reply] : replies_) {
      reqs.emplace_back();
      MPI_Isend(note.data(), static_cast<int>(note.size()), MPI_CHAR, r, kTagNotice, svc_,
                &reqs.back());
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    int done = 0;
    while (!done && std::chrono::steady_clock::now() < deadline) {
      MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
      if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // time to print
  }

  void serve() {
    while (!stop_) {
      int flag = 0;
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, kTagNotice, svc_, &flag, &st);
      if (flag) {
        int len = 0;
        MPI_Get_count(&st, MPI_CHAR, &len);
        std::string s(static_cast<size_t>(len), '\0');
        MPI_Recv(s.data(), len, MPI_CHAR, st.MPI_SOURCE, kTagNotice, svc_, MPI_STATUS_IGNORE);
        std::fprintf(stderr, "[rank %d] %s\n", rank_, s.c_str());
        std::fflush(stderr);
        continue;
      }
      MPI_Iprobe(MPI_ANY_SOURCE, kTagRequest, svc_, &flag, &st);
      if (!flag) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        continue;
      }
      int len = 0;
      MPI_Get_count(&st, MPI_CHAR, &len);
      std::string s(static_cast<size_t>(len), '\0');
      MPI_Recv(s.data(), len, MPI_CHAR, st.MPI_SOURCE, kTagRequest, svc_, MPI_STATUS_IGNORE);
      size_t a = s.find('\n'), b = s.find('\n', a + 1);
      std::string group = s.substr(0, a);
      int64_t seq = std::stoll(s.substr(a + 1, b - a - 1));
      auto op = static_cast<OpType>(std::stoi(s.substr(b + 1)));
      bool arrived = false, differs = false;
      std::string act = Job::rank_activity(rank_, group, seq, op, &arrived, &differs);
      std::string reply = std::string(arrived ? "1" : "0") + (differs ? "1" : "0") + act;
      MPI_Send(reply.data(), static_cast<int>(reply.size()), MPI_CHAR, st.MPI_SOURCE, kTagReply,
               svc_);
    }
  }
  int rank_;
  MPI_Comm svc_;
  std::thread service_;
  std::atomic<bool> stop_{false};
  std::map<int, std::string> replies_;
  std::vector<std::string> host_;  // by world rank
  std::string lost_;               // diagnose()'s lost hosts, "" if none
};

}  // namespace

std::unique_ptr<Job> make_mpi_job(double timeout_s, int rank) {
  return std::make_unique<MpiJob>(timeout_s, rank);
}

}  // namespace mt::comm

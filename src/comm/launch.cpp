#include "comm/launch.h"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>

#include "comm/local.h"
#include "comm/mpi.h"
#include "core/error.h"

namespace mt::comm {

BackendKind parse_backend(std::string_view name) {
  if (name == "auto") return BackendKind::kAuto;
  if (name == "local") return BackendKind::kLocal;
  if (name == "mpi") return BackendKind::kMpi;
  fail("--backend {} is not a backend; use local, mpi or auto", name);
}

std::string_view backend_name(BackendKind k) {
  switch (k) {
    case BackendKind::kAuto:
      return "auto";
    case BackendKind::kLocal:
      return "local";
    case BackendKind::kMpi:
      return "mpi";
  }
  return "?";
}

bool started_by_mpirun() { return mpi_env_world_size() > 0; }

BackendKind resolve_backend(const LaunchOptions& opts) {
  if (opts.backend != BackendKind::kAuto) return opts.backend;
  return started_by_mpirun() ? BackendKind::kMpi : BackendKind::kLocal;
}

int launch_world_size(const LaunchOptions& opts) {
  if (resolve_backend(opts) == BackendKind::kMpi) {
    int n = mpi_env_world_size();
    return n > 0 ? n : opts.world_size;
  }
  return opts.world_size;
}

mem::Tracker* tracker_for_rank(const LaunchOptions& opts, int rank) {
  if (opts.rank_trackers.empty()) return nullptr;
  if (opts.rank_trackers.size() == 1) return opts.rank_trackers[0];
  if (rank < 0 || rank >= static_cast<int>(opts.rank_trackers.size()))
    fail("{} trackers given for rank {}; give one per rank", opts.rank_trackers.size(), rank);
  return opts.rank_trackers[static_cast<size_t>(rank)];
}

namespace {

void launch_local(const LaunchOptions& opts, const std::function<void(Group& world)>& fn) {
  const int n = opts.world_size;
  if (n < 1) fail("the local backend needs at least 1 rank, got world size {}", n);
  auto job = std::make_shared<LocalJob>(n, opts.timeout_s);
  std::vector<int> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  auto world_shared = job->shared("world", "world", all);
  if (opts.timeout_s > 0) job->start_watchdog();

  std::mutex mu;
  std::condition_variable cv;
  int finished = 0;
  std::string first_error;
  int first_code = 0;

  auto on_error = [&](int rank, const std::string& what, int code) {
    std::string msg;
    bool root_cause = false;
    {
      std::lock_guard lock(mu);
      if (!job->aborted() && first_error.empty()) {
        first_error = what.rfind("[rank ", 0) == 0 ? what : fmt::format("[rank {}] {}", rank, what);
        first_code = code;
        root_cause = true;
        msg = first_error;
      }
    }
    if (root_cause) job->abort(msg);
  };

  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        std::optional<mem::ScopedTracker> scope;
        if (mem::Tracker* t = tracker_for_rank(opts, r)) scope.emplace(*t);
        auto ctx = std::make_shared<RankContext>(r, n, opts.recorder_capacity, job.get());
        job->add_rank(ctx);
        Group world(ctx, make_local_backend(*job, world_shared, r), "world", all);
        fn(world);
      } catch (const Error& e) {
        on_error(r, e.what(), e.exit_code());
      } catch (const std::exception& e) {
        on_error(r, e.what(), static_cast<int>(ExitCode::kRunFailure));
      }
      std::lock_guard lock(mu);
      ++finished;
      cv.notify_all();
    });
  }

  {
    std::unique_lock lock(mu);
    double abort_seen_s = -1;
    while (finished < n) {
      cv.wait_for(lock, std::chrono::milliseconds(50));
      if (job->aborted()) {
        auto now =
            std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
                .count();
        if (abort_seen_s < 0) abort_seen_s = now;
        if (finished < n && now - abort_seen_s > opts.grace_s) {
          // A rank does not unwind (stuck outside communication): end the process.
          std::string reason = first_error.empty() ? job->abort_reason() : first_error;
          std::fprintf(stderr,
                       "error: %s\n(%d of %d ranks did not stop within %.0f s; ending "
                       "the process)\n",
                       reason.c_str(), n - finished, n, opts.grace_s);
          std::fflush(stderr);
          std::_Exit(first_code ? first_code : static_cast<int>(ExitCode::kRunFailure));
        }
      }
    }
  }
  for (auto& t : threads) t.join();
  job->stop_watchdog();
  if (job->aborted()) {
    std::string reason = first_error.empty() ? job->abort_reason() : first_error;
    throw Error(reason, first_code ? static_cast<ExitCode>(first_code) : ExitCode::kRunFailure);
  }
}

}  // namespace

void launch(const LaunchOptions& opts, const std::function<void(Group& world)>& fn) {
  if (resolve_backend(opts) == BackendKind::kMpi)
    launch_mpi(opts, fn);
  else
    launch_local(opts, fn);
}

}  // namespace mt::comm

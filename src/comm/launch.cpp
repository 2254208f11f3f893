#include "comm/launch.h"

#include <sched.h>

#include <algorithm>
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
#include "core/device.h"
#include "core/error.h"

#if MESHTRAIN_CUDA
#include "comm/nccl/nccl_backend.h"
#endif

namespace mt::comm {

BackendKind parse_backend(std::string_view name) {
  if (name == "auto") return BackendKind::kAuto;
  if (name == "local") return BackendKind::kLocal;
  if (name == "mpi") return BackendKind::kMpi;
  if (name == "nccl") return BackendKind::kNccl;
  fail("--backend {} is not a backend; use local, mpi, nccl or auto", name);
}

std::string_view backend_name(BackendKind k) {
  switch (k) {
    case BackendKind::kAuto:
      return "auto";
    case BackendKind::kLocal:
      return "local";
    case BackendKind::kMpi:
      return "mpi";
    case BackendKind::kNccl:
      return "nccl";
  }
  return "?";
}

bool started_by_mpirun() { return mpi_env_world_size() > 0; }

int mpi_env_local_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* s = std::getenv(v)) return std::atoi(s);
  return -1;
}

BackendKind resolve_backend(const LaunchOptions& opts) {
  if (opts.backend != BackendKind::kAuto) return opts.backend;
  return started_by_mpirun() ? BackendKind::kMpi : BackendKind::kLocal;
}

int launch_world_size(const LaunchOptions& opts) {
  const BackendKind k = resolve_backend(opts);
  // Outside mpirun the mpi backend would be a job of one process (a singleton MPI_Init):
  // say how to start it rather than report the size mpirun never gave.
  if (k == BackendKind::kMpi && !started_by_mpirun()) {
    const std::string n = opts.world_size > 0 ? std::to_string(opts.world_size) : "N";
    fail(
        "--backend mpi runs one process per rank and needs mpirun: start the job with `mpirun "
        "-np {} meshtrain ...`{}, or use --backend local (or auto) to run the ranks as threads "
        "of this process",
        n, opts.world_size > 0 ? "" : " (N: the job's ranks, --pp x --dp x --tp for train)");
  }
  if (k == BackendKind::kMpi || (k == BackendKind::kNccl && started_by_mpirun())) {
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

// The cores this process may run on.
int process_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return std::max(1u, std::thread::hardware_concurrency());
}

double local_spin_seconds(const LaunchOptions& opts) {
  constexpr double kSpinWhenRanksHaveCores = 100e-6;
  if (opts.threads_per_rank <= 0) return 0;
  return int64_t{opts.world_size} * opts.threads_per_rank <= process_cores()
             ? kSpinWhenRanksHaveCores
             : 0;
}

namespace {

void launch_local(const LaunchOptions& opts, const std::function<void(Group& world)>& fn,
                  const std::string& world_name = "world") {
  const int n = opts.world_size;
  if (n < 1) fail("the local backend needs at least 1 rank, got world size {}", n);
  auto job = std::make_shared<LocalJob>(n, opts.timeout_s, local_spin_seconds(opts));
  std::vector<int> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  auto world_shared = job->shared(world_name, world_name, all);
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
      // (A rank whose unwinding ended the job, its async ops in flight, is the root cause.)
      if ((!job->aborted() || job->unwinding_rank() == rank) && first_error.empty()) {
        first_error = what.rfind("[rank ", 0) == 0 ? what : fmt::format("[rank {}] {}", rank, what);
        first_code = code;
        root_cause = true;
        msg = first_error;
      }
    }
    if (root_cause) job->abort(msg);  // (already aborted: nothing)
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
        Group world(ctx, make_local_backend(*job, world_shared, r), world_name, all);
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

// --backend nccl: the ranks start as local threads or mpi processes whose world group
// ("host") carries the bootstrap and host-memory ops; each rank then selects its GPU and fn
// gets the NCCL world.
void launch_nccl(const LaunchOptions& opts, const std::function<void(Group& world)>& fn) {
#if MESHTRAIN_CUDA
  const bool mpi = started_by_mpirun();
  const int gpus = device::cuda_device_count();
  // Refused before any rank starts: NCCL refuses two ranks on one GPU.
  int on_host = opts.world_size;
  if (mpi) {
    const char* s = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    on_host = s ? std::atoi(s) : 1;
  }
  if (gpus == 0)
    fail(
        "--backend nccl: no CUDA GPU is visible (cudaGetDeviceCount found none; check "
        "nvidia-smi and CUDA_VISIBLE_DEVICES, or use --backend local)");
  if (on_host > gpus)
    fail(
        "--backend nccl: {} ranks on this host but {} GPU{} visible; NCCL needs one GPU per "
        "rank (use at most {} ranks per host, or --backend local to share GPUs among rank "
        "threads)",
        on_host, gpus, gpus == 1 ? " is" : "s are", gpus);
  auto per_rank = [&](Group& host) {
    const int local = mpi ? mpi_env_local_rank() : host.rank();
    if (local < 0)
      fail(
          "--backend nccl under mpirun: this process's local rank is unknown (set "
          "OMPI_COMM_WORLD_LOCAL_RANK, as Open MPI's mpirun does)");
    if (local >= gpus)
      fail(
          "--backend nccl: local rank {} has no GPU of its own ({} visible); NCCL needs one "
          "GPU per rank",
          local, gpus);
    device::use_cuda(local);
    Group world(host.context(), make_nccl_backend(host), "world", host.world_ranks());
    fn(world);
    world.barrier();  // nobody destroys its communicator while others still use theirs
  };
  if (mpi)
    launch_mpi(opts, per_rank, "host");
  else
    launch_local(opts, per_rank, "host");
#else
  (void)opts, (void)fn;
  fail(
      "--backend nccl: this meshtrain was built without CUDA, so without the NCCL backend; "
      "configure with -DMESHTRAIN_CUDA=ON on a machine with the CUDA toolkit and NCCL, or use "
      "--backend local or mpi");
#endif
}

}  // namespace

void launch(const LaunchOptions& opts, const std::function<void(Group& world)>& fn) {
  switch (resolve_backend(opts)) {
    case BackendKind::kMpi:
      launch_mpi(opts, fn);
      break;
    case BackendKind::kNccl:
      launch_nccl(opts, fn);
      break;
    default:
      launch_local(opts, fn);
  }
}

}  // namespace mt::comm

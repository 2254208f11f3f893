// Starting the ranks of a job: `local` runs world_size threads in this process; `mpi` runs
// one rank per process under mpirun. Either way `fn` runs once per rank with that rank's
// world group; the mesh groups come from DeviceMesh (comm/mesh.h).
//
//   comm::LaunchOptions opts;               // backend auto: mpi under mpirun, else local
//   opts.world_size = 8;                    // local: 8 threads (mpi: must match -np or be 0)
//   opts.timeout_s = 300;                   // --comm-timeout
//   comm::launch(opts, [&](comm::Group& world) {
//     mem::Tracker tracker;                 // each rank installs its own tracker in fn
//     mem::ScopedTracker scope(tracker);
//     comm::DeviceMesh mesh(world, comm::MeshShape({{"dp", 2}, {"tp", 4}}, world.size()));
//     comm::Group& tp = mesh.group("tp");
//     ...
//   });
//
// An exception in any rank ends the whole job: under `local` every other rank's pending or
// next op throws and launch() then throws mt::Error "[rank N] <first error>" with that
// error's exit code; under `mpi` the failing process prints "[rank N] error: ..." and calls
// MPI_Abort(code), which ends every process. A watchdog timeout ends the job the same way,
// with the diagnosis.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "comm/group.h"

namespace mt::comm {

// nccl: ranks start as for local (threads) or mpi (under mpirun); each rank thread then
// computes on GPU <its local rank> (device::use_cuda) and fn gets a world group whose
// collectives on GPU buffers run through NCCL (comm/nccl/nccl_backend.h). One GPU per rank.
enum class BackendKind : uint8_t { kAuto, kLocal, kMpi, kNccl };
// "auto", "local", "mpi", "nccl"; fails otherwise
BackendKind parse_backend(std::string_view name);
std::string_view backend_name(BackendKind k);

struct LaunchOptions {
  BackendKind backend = BackendKind::kAuto;
  // local: the number of rank threads. mpi: 0, or the expected number of processes.
  int world_size = 1;
  double timeout_s = 300;  // watchdog (--comm-timeout); <= 0 disables it
  size_t recorder_capacity = 2048;
  // local: the intra-op threads each rank runs (0: not said). When every rank's threads have
  // a core of their own (world_size x threads_per_rank <= this process's cores), a rank
  // waiting for its peers in a collective spins for up to 100 us before it sleeps: the peer
  // is usually microseconds away, and a sleeping thread takes tens of microseconds to wake.
  // Otherwise (8-12 rank threads on 2 cores) it spins only briefly, leaving the cores to the
  // ranks that have work.
  int threads_per_rank = 0;
  // mpi: exchange a small header (op, seq, dtype, counts) before each collective and refuse
  // a mismatch (costs one small allgather per op). Also on with MESHTRAIN_COMM_DEBUG=1.
  bool check_headers = false;
  // After abort, how long launch() waits for rank threads to unwind before ending the
  // process with the diagnosis (a rank stuck in computation cannot be interrupted).
  double grace_s = 3;
  // Optional accounting trackers, one per rank: before fn, rank r's thread installs
  // rank_trackers[r] with mem::ScopedTracker (mpi: this process's rank; a single entry
  // serves every rank of a process). Empty: fn installs its own tracker if it wants one.
  std::vector<mem::Tracker*> rank_trackers;
};
// The tracker `opts` gives rank `rank`, or nullptr.
mem::Tracker* tracker_for_rank(const LaunchOptions& opts, int rank);

// True when this process was started by mpirun (OMPI_COMM_WORLD_SIZE or PMI_SIZE in the
// environment).
bool started_by_mpirun();
// This process's rank among those on its host under mpirun (OMPI_COMM_WORLD_LOCAL_RANK,
// MPI_LOCALRANKID or SLURM_LOCALID), or -1 when none is set.
int mpi_env_local_rank();
// The backend `opts` resolves to (kAuto -> kMpi under mpirun, else kLocal).
BackendKind resolve_backend(const LaunchOptions& opts);
// The number of ranks the job will have, known before any work (to refuse bad layouts):
// opts.world_size for local, mpirun's size for mpi (and for nccl under mpirun). Refuses mpi
// outside mpirun, saying how to start the job.
int launch_world_size(const LaunchOptions& opts);

// The cores this process may run on (its affinity mask).
int process_cores();
// How long a rank of a local job waiting in a collective spins before it sleeps:
// LaunchOptions::threads_per_rank's rule (0 = a few hundred pauses only).
double local_spin_seconds(const LaunchOptions& opts);

void launch(const LaunchOptions& opts, const std::function<void(Group& world)>& fn);

}  // namespace mt::comm

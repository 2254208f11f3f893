// The `mpi` backend: one rank per process under mpirun (Open MPI; MPI_THREAD_MULTIPLE).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/launch.h"

namespace mt::comm {

// Initialises MPI (thread multiple), runs fn once with this process's world group, and
// finalises. A failure prints "[rank N] error: ..." and calls MPI_Abort with its exit code.
// `world_name` names the world group ("host" when the nccl backend builds its world on it).
void launch_mpi(const LaunchOptions& opts, const std::function<void(Group& world)>& fn,
                const std::string& world_name = "world");
// Every process's `mine` concatenated in rank order on world rank 0 (empty elsewhere): an
// MPI_Gatherv over MPI_COMM_WORLD, for a program that runs a job under mpirun and then
// works on rank 0 alone (verify's routing replay). Every process must call it, after the
// job and before the process ends; refused where MPI is not running.
std::vector<int32_t> gather_to_world_root(const std::vector<int32_t>& mine);
// mpirun's world size from the environment, or 0.
int mpi_env_world_size();
// This process's rank under mpirun from the environment, or 0 outside mpirun.
int mpi_env_world_rank();

// A reduce-scatter (and so an all-reduce) receives the n ranks' copies of its piece in rounds
// of at most this many bytes from each rank, reducing each round in rank order: its scratch
// is n · min(piece, kMpiSegmentBytes), not the whole buffer (the planner counts the same).
inline constexpr int64_t kMpiSegmentBytes = int64_t{1} << 20;

}  // namespace mt::comm

// The `mpi` backend: one rank per process under mpirun (Open MPI; MPI_THREAD_MULTIPLE).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "comm/launch.h"

namespace mt::comm {

// Initialises MPI (thread multiple), runs fn once with this process's world group, and
// finalises. A failure prints "[rank N] error: ..." and calls MPI_Abort with its exit code.
// `world_name` names the world group ("host" when the nccl backend builds its world on it).
void launch_mpi(const LaunchOptions& opts, const std::function<void(Group& world)>& fn,
                const std::string& world_name = "world");
// mpirun's world size from the environment, or 0.
int mpi_env_world_size();
// This process's rank under mpirun from the environment, or 0 outside mpirun.
int mpi_env_world_rank();

// A reduce-scatter (and so an all-reduce) receives the n ranks' copies of its piece in rounds
// of at most this many bytes from each rank, reducing each round in rank order: its scratch
// is n · min(piece, kMpiSegmentBytes), not the whole buffer (the planner counts the same).
inline constexpr int64_t kMpiSegmentBytes = int64_t{1} << 20;

}  // namespace mt::comm

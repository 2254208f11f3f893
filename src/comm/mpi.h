// The `mpi` backend: one rank per process under mpirun (Open MPI; MPI_THREAD_MULTIPLE).
#pragma once

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

}  // namespace mt::comm

// Where a rank runs: how many rank threads or processes share this host's cores, the
// intra-op threads each gets, the mesh --mesh-order names, and the GPU of a rank.
#pragma once

#include <string>

#include "comm/hosts.h"
#include "comm/launch.h"
#include "comm/mesh.h"
#include "train/trainer.h"

namespace mt::train {

// The ranks whose threads share this host's cores: every rank thread of the local backend;
// one process per rank (mpi, or nccl under mpirun) the ones mpirun put on this host.
int ranks_on_host(const TrainOptions& o, comm::BackendKind backend);
// Intra-op threads of one rank: cores on this host shared by the ranks on this host.
int rank_threads(const TrainOptions& o, comm::BackendKind backend);
// The mesh: --mesh-order names pp, dp, cp and tp, slowest first (cp left out: just before
// tp; ep left out: just after dp).
comm::MeshShape make_mesh_shape(const TrainOptions& o, int world);
// The GPU of a rank: its index among the ranks of its host modulo the GPUs there.
int gpu_of_rank(int world_rank);
// On several hosts: which dimensions' groups span hosts, on any rank (from the groups as
// made, so a placement that went wrong shows), as comm::describe_placement words it; empty
// on one host. Collective on `scalars`.
std::string host_placement(comm::DeviceMesh& mesh, const comm::HostMap& hosts,
                           comm::Group* scalars);

}  // namespace mt::train

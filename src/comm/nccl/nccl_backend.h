// The `nccl` backend: a Group's collectives on GPU buffers run as NCCL operations on the
// communicator of the group (one GPU per rank). Built only with MESHTRAIN_CUDA (the file is
// compiled into mt_comm by CMake then); see docs/comm.md, "The NCCL backend".
//
//  - Bootstrap: rank 0 of the host world group (local threads or MPI processes) makes the
//    ncclUniqueId and broadcasts it over that group; every rank then calls
//    ncclCommInitRank on the GPU its thread uses (device::current_index()).
//  - Each backend keeps a host twin of its group (split from the host world the same way),
//    which runs the ops whose buffers are in host memory (scalars such as the loss) and
//    gives split() its world ranks.
//  - Ordering: an op runs on the backend's own stream, after the work the calling rank
//    queued on its stream before the call; the rank's stream then waits for the op (events,
//    no host wait). So kernels queued after the call see the result.
#pragma once

#include <memory>

#include "comm/group.h"

namespace mt::comm {

// Collective over `host_world` (every rank calls it, on the rank thread that computes on
// the GPU it will use). Returns the NCCL backend of the world group; the caller wraps it in
// a Group named "world".
std::unique_ptr<Backend> make_nccl_backend(Group& host_world);

}  // namespace mt::comm

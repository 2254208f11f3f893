// The job of the `mpi` backend: one rank per process. Its watchdog asks the other ranks what
// they are doing (a service thread in each answers on a communicator of its own), names the
// hosts whose ranks do not answer, tells every rank that does answer why the job ends (each
// prints it to its own log), then calls MPI_Abort (docs/comm.md, docs/multihost.md).
#pragma once

#include <memory>

#include "comm/job.h"

namespace mt::comm {

// Collective over MPI_COMM_WORLD (it exchanges the ranks' host names).
std::unique_ptr<Job> make_mpi_job(double timeout_s, int rank);

}  // namespace mt::comm

#include "train/rank_placement.h"

#include <algorithm>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "comm/mpi.h"
#include "core/device.h"
#include "core/error.h"
#include "kernels/kernels.h"

namespace mt::train {

// The ranks whose threads share this host's cores: every rank thread of the local backend;
// one process per rank (mpi, or nccl under mpirun) the ones mpirun put on this host.
int ranks_on_host(const TrainOptions& o, comm::BackendKind backend) {
  int on_host = o.world_size();
  if (backend == comm::BackendKind::kMpi || comm::started_by_mpirun())
    if (const char* s = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) on_host = std::atoi(s);
  return std::max(1, on_host);
}

// Intra-op threads of one rank: cores on this host shared by the ranks on this host.
int rank_threads(const TrainOptions& o, comm::BackendKind backend) {
  if (o.threads > 0) return o.threads;
  return std::max(1, kernels::host_cores() / ranks_on_host(o, backend));
}

// The mesh: --mesh-order names pp, dp, cp and tp, slowest first (cp left out: just before
// tp; ep left out: just after dp).
comm::MeshShape make_mesh_shape(const TrainOptions& o, int world) {
  std::vector<std::string> order;
  std::string name;
  for (char ch : o.mesh_order + ",") {
    if (ch != ',') {
      name += ch;
      continue;
    }
    if (name != "pp" && name != "dp" && name != "ep" && name != "cp" && name != "tp")
      fail("--mesh-order '{}': '{}' is not pp, dp, ep, cp or tp (e.g. --mesh-order pp,dp,cp,tp)",
           o.mesh_order, name);
    order.push_back(name);
    name.clear();
  }
  const std::set<std::string> names(order.begin(), order.end());
  if (names.size() != order.size() || !names.count("pp") || !names.count("dp") ||
      !names.count("tp") || order.size() < 3)
    fail("--mesh-order '{}' must name pp, dp, cp and tp once each (e.g. pp,dp,cp,tp)",
         o.mesh_order);
  if (!names.count("cp")) order.insert(std::find(order.begin(), order.end(), "tp"), "cp");
  if (!names.count("ep")) order.insert(std::find(order.begin(), order.end(), "dp") + 1, "ep");
  // ep is carved from dp: the mesh's dp is what is left of it (the experts' data parallelism).
  return comm::MeshShape(
      {{"pp", o.pipeline.pp}, {"dp", o.dp / o.ep}, {"ep", o.ep}, {"cp", o.cp}, {"tp", o.tp}}, world,
      order);
}

// The GPU of a rank: its index among the ranks of its host (the launcher's local rank, or
// the thread's rank under the local backend; the choice --backend nccl makes too) modulo the
// GPUs there. Ranks beyond the GPU count share GPUs, which the local and mpi backends allow
// (NCCL does not).
int gpu_of_rank(int world_rank) {
  const int env = comm::mpi_env_local_rank();
  const int local = env >= 0 ? env : world_rank;
  const int n = device::cuda_device_count();
  return n > 0 ? local % n : 0;
}

std::string host_placement(comm::DeviceMesh& mesh, const comm::HostMap& hosts,
                           comm::Group* scalars) {
  if (hosts.hosts() <= 1 || !scalars) return "";
  std::vector<std::pair<std::string, bool>> across;  // dims of size > 1, slowest first
  std::vector<float> spans;
  for (const std::string& dim : mesh.shape().order())
    spans.push_back(comm::spans_hosts(mesh.group(dim), hosts) ? 1.0f : 0.0f);
  scalars->all_reduce(comm::Buf(spans.data(), static_cast<int64_t>(spans.size())),
                      comm::ReduceOp::kMax);
  for (size_t i = 0; i < spans.size(); ++i)
    if (mesh.shape().size(mesh.shape().order()[i]) > 1)
      across.emplace_back(mesh.shape().order()[i], spans[i] > 0);
  return comm::describe_placement(across, hosts);
}

}  // namespace mt::train

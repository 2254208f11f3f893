// Which host each rank runs on, and a world ordered host by host (docs/multihost.md).
//
// A rank's host is its host name (gethostname: what MPI_Get_processor_name returns under Open
// MPI; on the namespace hosts of scripts/hosts.sh, the namespace's name). Hosts are numbered
// in the order of their lowest world rank. Ordering the world host by host (rank 0 stays
// rank 0) lets the mesh's fastest dimensions (tp, then cp, ...) fall inside a host whatever
// the way mpirun mapped the ranks (--map-by slot or node).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/group.h"

namespace mt::comm {

struct HostMap {
  std::vector<std::string> names;  // by host index
  std::vector<int> host_of_rank;   // by world rank (the job's, Group::world_ranks)
  int hosts() const { return static_cast<int>(names.size()); }
  int max_ranks_per_host() const;
};

// This process's host name ("?" when the system will not say).
std::string this_host_name();

// Collective over `world` (the job's world group): every rank's host name (at most 63 bytes
// are compared).
HostMap exchange_host_names(Group& world);

// Collective over `world` (the job's world group) when the ranks span several hosts: `world`
// ordered by (host index, rank), named `name`; nullptr (no collective) when every rank is on
// one host. Rank 0 stays rank 0 (its host is host 0 and it is that host's lowest rank).
std::unique_ptr<Group> order_by_host(Group& world, const HostMap& hosts, const std::string& name);

// Whether `group`'s members run on more than one host.
bool spans_hosts(const Group& group, const HostMap& hosts);

// "2 hosts (up to 4 ranks each); tp inside hosts; dp across hosts", from each dimension of
// size > 1 (slowest first) and whether some group of it spans hosts.
std::string describe_placement(const std::vector<std::pair<std::string, bool>>& dims_across,
                               const HostMap& hosts);

}  // namespace mt::comm

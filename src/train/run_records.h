// What a run records about itself for `meshtrain report` and the metrics file: the first
// row's header, every rank's peak memory by category.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "comm/group.h"
#include "comm/hosts.h"
#include "comm/mesh.h"
#include "core/memory.h"
#include "model/config.h"
#include "train/trainer.h"

namespace mt::train {

// int64 values all-gathered over g (g null: just mine), rank-ordered.
std::vector<int64_t> gather_int64(comm::Group* g, const std::vector<int64_t>& mine);
// The first metrics row's "run": what `meshtrain report` puts in its header.
nlohmann::json run_header(const TrainOptions& o, int threads, comm::Group& world,
                          const model::GptConfig& padded);
// Every rank's peak bytes by category, rank-ordered, and the rank with the largest total.
struct RankPeaks {
  std::vector<int64_t> all;  // per rank: kNumCategories peaks, then the total
  size_t width = 0;          // values per rank
  size_t worst = 0;          // the rank with the largest total
  int64_t at(size_t rank, size_t k) const { return all[rank * width + k]; }
  int64_t total(size_t rank) const { return at(rank, width - 1); }
};
RankPeaks gather_rank_peaks(comm::Group* scalars, const mem::Snapshot& snap);
// The same as the last metrics row's "memory_by_rank".
nlohmann::json memory_by_rank(comm::Group* scalars, const mem::Tracker& tracker);
// "peak memory: worst rank R (pp .. dp .. [ep ..] [cp ..] tp ..) TOTAL: category bytes, ...".
std::string peak_memory_line(const RankPeaks& peaks, const comm::MeshShape& shape, bool ep,
                             bool cp);
// On several hosts: "bytes received over groups that cross hosts (all ranks): tp .. dp ..",
// the flight recorders' counts on the groups (by dimension) that span hosts, summed over the
// ranks on `scalars` (collective).
std::string bytes_across_hosts_line(const std::vector<std::pair<std::string, comm::Group*>>& dims,
                                    const comm::MeshShape& shape, const comm::HostMap& hosts,
                                    comm::Group& scalars);

}  // namespace mt::train

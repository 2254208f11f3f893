#include "model/routing_tape.h"

#include "core/error.h"

namespace mt::model {

void RoutingTape::record(int64_t sample, int layer, const int32_t* expert, const int32_t* slot,
                         int64_t nk) {
  Entry e;
  e.expert.assign(expert, expert + nk);
  e.dropped.resize(static_cast<size_t>(nk));
  for (int64_t a = 0; a < nk; ++a) e.dropped[static_cast<size_t>(a)] = slot[a] < 0 ? 1 : 0;
  std::lock_guard lock(mu_);
  const auto key = std::make_pair(sample, layer);
  const auto it = entries_.find(key);
  if (it == entries_.end()) {
    entries_.emplace(key, std::move(e));
    return;
  }
  if (it->second.expert != e.expert || it->second.dropped != e.dropped)
    fail_run(
        "routing replay: two ranks routed the microbatch of sample {} differently in layer {} "
        "(tp ranks must route alike)",
        sample, layer);
}

const RoutingTape::Entry& RoutingTape::find(int64_t sample, int layer, int64_t nk) const {
  std::lock_guard lock(mu_);
  const auto it = entries_.find({sample, layer});
  if (it == entries_.end() || static_cast<int64_t>(it->second.expert.size()) != nk)
    fail_run(
        "routing replay: no recorded routing of {} assignments for the microbatch of sample {} "
        "in layer {} (the replaying run must use the recording run's microbatch size)",
        nk, sample, layer);
  return it->second;
}

size_t RoutingTape::size() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

}  // namespace mt::model

#include "model/routing_tape.h"

#include "core/error.h"

namespace mt::model {

void RoutingTape::record(int64_t sample, int layer, const int32_t* expert, const int32_t* slot,
                         int64_t nk) {
  Entry e;
  e.expert.assign(expert, expert + nk);
  e.dropped.resize(static_cast<size_t>(nk));
  for (int64_t a = 0; a < nk; ++a) e.dropped[static_cast<size_t>(a)] = slot[a] < 0 ? 1 : 0;
  add(sample, layer, std::move(e));
}

void RoutingTape::record_rows(int64_t sample, int layer, const int32_t* expert, const int32_t* slot,
                              int64_t k, const std::vector<int64_t>& rows, int64_t whole_rows) {
  Entry e;
  e.expert.assign(static_cast<size_t>(whole_rows * k), kUnrecorded);
  e.dropped.assign(static_cast<size_t>(whole_rows * k), 0);
  for (size_t t = 0; t < rows.size(); ++t) {
    if (rows[t] < 0 || rows[t] >= whole_rows)
      fail_run("routing replay: row {} of a cp rank maps outside the microbatch's {} rows", rows[t],
               whole_rows);
    for (int64_t j = 0; j < k; ++j) {
      const size_t from = t * static_cast<size_t>(k) + static_cast<size_t>(j);
      const size_t to = static_cast<size_t>(rows[t] * k + j);
      e.expert[to] = expert[from];
      e.dropped[to] = slot[from] < 0 ? 1 : 0;
    }
  }
  add(sample, layer, std::move(e));
}

void RoutingTape::add(int64_t sample, int layer, Entry e) {
  std::lock_guard lock(mu_);
  const auto key = std::make_pair(sample, layer);
  const auto it = entries_.find(key);
  if (it == entries_.end()) {
    entries_.emplace(key, std::move(e));
    return;
  }
  Entry& have = it->second;
  if (have.expert.size() != e.expert.size())
    fail_run(
        "routing replay: two ranks recorded the microbatch of sample {} in layer {} with {} and "
        "{} assignments",
        sample, layer, have.expert.size(), e.expert.size());
  for (size_t a = 0; a < e.expert.size(); ++a) {
    if (e.expert[a] == kUnrecorded) continue;
    if (have.expert[a] == kUnrecorded) {
      have.expert[a] = e.expert[a];
      have.dropped[a] = e.dropped[a];
    } else if (have.expert[a] != e.expert[a] || have.dropped[a] != e.dropped[a]) {
      fail_run(
          "routing replay: two ranks routed the microbatch of sample {} differently in layer {} "
          "(assignment {}; tp ranks must route alike)",
          sample, layer, a);
    }
  }
}

const RoutingTape::Entry& RoutingTape::find(int64_t sample, int layer, int64_t nk) const {
  std::lock_guard lock(mu_);
  const auto it = entries_.find({sample, layer});
  if (it == entries_.end() || static_cast<int64_t>(it->second.expert.size()) != nk)
    fail_run(
        "routing replay: no recorded routing of {} assignments for the microbatch of sample {} "
        "in layer {} (the replaying run must use the recording run's microbatch size)",
        nk, sample, layer);
  for (size_t a = 0; a < it->second.expert.size(); ++a)
    if (it->second.expert[a] == kUnrecorded)
      fail_run(
          "routing replay: assignment {} of the microbatch of sample {} in layer {} was never "
          "recorded (a cp rank's rows are missing from the tape)",
          a, sample, layer);
  return it->second;
}

std::vector<int32_t> RoutingTape::serialize() const {
  std::lock_guard lock(mu_);
  std::vector<int32_t> w;
  for (const auto& [key, e] : entries_) {
    const auto sample = static_cast<uint64_t>(key.first);
    w.push_back(static_cast<int32_t>(static_cast<uint32_t>(sample & 0xffffffffu)));
    w.push_back(static_cast<int32_t>(static_cast<uint32_t>(sample >> 32)));
    w.push_back(key.second);
    w.push_back(static_cast<int32_t>(e.expert.size()));
    w.insert(w.end(), e.expert.begin(), e.expert.end());
    for (uint8_t d : e.dropped) w.push_back(d);
  }
  return w;
}

void RoutingTape::merge(const std::vector<int32_t>& words) {
  size_t i = 0;
  while (i < words.size()) {
    if (words.size() - i < 4)
      fail_run("routing replay: a gathered tape ends inside an entry's header at word {} of {}", i,
               words.size());
    const uint64_t lo = static_cast<uint32_t>(words[i]), hi = static_cast<uint32_t>(words[i + 1]);
    const auto sample = static_cast<int64_t>(lo | (hi << 32));
    const int layer = words[i + 2];
    const int64_t nk = words[i + 3];
    i += 4;
    if (nk < 0 || static_cast<uint64_t>(nk) * 2 > words.size() - i)
      fail_run(
          "routing replay: a gathered tape's entry (sample {}, layer {}) claims {} "
          "assignments, but {} words remain",
          sample, layer, nk, words.size() - i);
    Entry e;
    e.expert.assign(words.begin() + static_cast<std::ptrdiff_t>(i),
                    words.begin() + static_cast<std::ptrdiff_t>(i + static_cast<size_t>(nk)));
    i += static_cast<size_t>(nk);
    e.dropped.resize(static_cast<size_t>(nk));
    for (int64_t a = 0; a < nk; ++a) e.dropped[static_cast<size_t>(a)] = words[i++] != 0 ? 1 : 0;
    add(sample, layer, std::move(e));
  }
}

size_t RoutingTape::size() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

}  // namespace mt::model

#include "comm/recorder.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/clock.h"

namespace mt::comm {

std::string_view op_name(OpType op) {
  static constexpr std::string_view kNames[kNumOpTypes] = {
      "all_reduce", "reduce_scatter", "all_gather", "broadcast", "send",
      "recv",       "all_to_all",     "barrier",    "split"};
  return kNames[static_cast<int>(op)];
}

std::string_view reduce_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
  }
  return "?";
}

std::string_view state_name(OpState s) {
  switch (s) {
    case OpState::kQueued:
      return "queued";
    case OpState::kStarted:
      return "started";
    case OpState::kDone:
      return "done";
    case OpState::kFailed:
      return "failed";
  }
  return "?";
}

bool is_collective(OpType op) { return op != OpType::kSend && op != OpType::kRecv; }

std::string describe(const OpRecord& r) {
  std::string s = fmt::format("{} #{} on {}", op_name(r.op), r.seq, r.group);
  if (r.op == OpType::kSend) s += fmt::format(" to {} (tag {})", r.peer, r.tag);
  if (r.op == OpType::kRecv) s += fmt::format(" from {} (tag {})", r.peer, r.tag);
  if (r.op != OpType::kBarrier && r.op != OpType::kSplit)
    s += fmt::format(" ({}, {} elems)", dtype_name(r.dtype), r.elems);
  return s;
}

// Ids are handed out in order and the ring keeps the newest capacity_ of them in a circle
// of slots from the oldest's on: no search, and no allocation per op once the ring is full (the
// collectives of MoE's dispatch are a few microseconds each). An op that leaves the ring
// before it is done moves to evicted_.
OpRecord& FlightRecorder::slot_locked(int64_t id) {
  // All slots at the first op: growing the ring as ops come would reallocate and move it
  // (and fault its new pages in) again and again while it fills.
  if (ring_.empty()) ring_.resize(capacity_);
  if (id - first_id_ < static_cast<int64_t>(capacity_)) return ring_[index_locked(id)];
  OpRecord& old = ring_[first_slot_];  // the oldest op's slot takes the new one
  if (old.state == OpState::kQueued || old.state == OpState::kStarted)
    evicted_.emplace(old.id, old);
  first_id_ += 1;
  first_slot_ = first_slot_ + 1 == capacity_ ? 0 : first_slot_ + 1;
  return old;
}

int64_t FlightRecorder::on_queued(OpRecord r) {
  std::lock_guard lock(mu_);
  r.id = next_id_++;
  if (r.state != OpState::kStarted) r.state = OpState::kQueued;  // (an op run inline starts)
  OpRecord& slot = slot_locked(r.id);
  slot = std::move(r);
  return slot.id;
}

int64_t FlightRecorder::on_queued(const Start& s) {
  std::lock_guard lock(mu_);
  const int64_t id = next_id_++;
  OpRecord& r = slot_locked(id);
  r.id = id;
  r.group = *s.group;  // into the slot's own string: no allocation once it was as long
  r.op = s.op;
  r.seq = s.seq;
  r.dtype = s.dtype;
  r.elems = s.elems;
  r.peer = s.peer;
  r.tag = s.tag;
  r.state = s.started ? OpState::kStarted : OpState::kQueued;
  r.queued_s = s.at;
  r.started_s = s.started ? s.at : 0;
  r.done_s = 0;
  r.sent_bytes = r.recv_bytes = 0;
  return id;
}

OpRecord* FlightRecorder::find_locked(int64_t id) {
  if (id >= first_id_ && id < next_id_) return &ring_[index_locked(id)];
  auto it = evicted_.find(id);
  return it == evicted_.end() ? nullptr : &it->second;
}

void FlightRecorder::on_started(int64_t id) {
  std::lock_guard lock(mu_);
  if (OpRecord* r = find_locked(id)) {
    r->state = OpState::kStarted;
    r->started_s = mt::now_s();
  }
}

void FlightRecorder::on_done(int64_t id, int64_t sent_bytes, int64_t recv_bytes) {
  const double t = mt::now_s();  // (read before the lock: a shorter critical section)
  std::lock_guard lock(mu_);
  OpRecord* r = find_locked(id);
  if (!r) return;
  r->state = OpState::kDone;
  r->done_s = t;
  r->sent_bytes = sent_bytes;
  r->recv_bytes = recv_bytes;
  ByteCount& c = counter_locked(r->group, r->op);
  c.sent_bytes += sent_bytes;
  c.recv_bytes += recv_bytes;
  c.ops += 1;
  if (!evicted_.empty()) evicted_.erase(id);
}

ByteCount& FlightRecorder::counter_locked(const std::string& group, OpType op) {
  // The last op's counter first: a group's ops come in runs.
  if (last_counter_ && last_counter_->first.first == group && last_counter_->first.second == op)
    return last_counter_->second;
  auto it = counters_.find({group, op});
  if (it == counters_.end()) it = counters_.emplace(std::make_pair(group, op), ByteCount{}).first;
  last_counter_ = &*it;
  return it->second;
}

void FlightRecorder::on_failed(int64_t id) {
  std::lock_guard lock(mu_);
  if (OpRecord* r = find_locked(id)) {
    r->state = OpState::kFailed;
    r->done_s = mt::now_s();
  }
  evicted_.erase(id);
}

std::vector<OpRecord> FlightRecorder::last(size_t n) const {
  std::lock_guard lock(mu_);
  const int64_t k = std::min(static_cast<int64_t>(n), next_id_ - first_id_);
  std::vector<OpRecord> v;
  v.reserve(static_cast<size_t>(k));
  for (int64_t id = next_id_ - k; id < next_id_; ++id) v.push_back(at_locked(id));
  return v;
}

std::vector<OpRecord> FlightRecorder::in_flight() const {
  std::lock_guard lock(mu_);
  std::vector<OpRecord> v;
  for (const auto& [id, r] : evicted_) v.push_back(r);  // older than the ring's
  for (int64_t id = first_id_; id < next_id_; ++id) {
    const OpRecord& r = at_locked(id);
    if (r.state == OpState::kQueued || r.state == OpState::kStarted) v.push_back(r);
  }
  return v;
}

bool FlightRecorder::find_collective(const std::string& group, int64_t seq, OpRecord* out) const {
  std::lock_guard lock(mu_);
  for (int64_t id = next_id_ - 1; id >= first_id_; --id) {
    const OpRecord& r = at_locked(id);
    if (is_collective(r.op) && r.group == group && r.seq == seq) {
      *out = r;
      return true;
    }
  }
  for (const auto& [id, r] : evicted_)
    if (is_collective(r.op) && r.group == group && r.seq == seq) {
      *out = r;
      return true;
    }
  return false;
}

ByteCount FlightRecorder::bytes(const std::string& group, OpType op) const {
  std::lock_guard lock(mu_);
  auto it = counters_.find({group, op});
  return it == counters_.end() ? ByteCount{} : it->second;
}

ByteCount FlightRecorder::bytes_of_group(const std::string& group) const {
  std::lock_guard lock(mu_);
  ByteCount t;
  for (const auto& [k, c] : counters_)
    if (k.first == group) {
      t.sent_bytes += c.sent_bytes;
      t.recv_bytes += c.recv_bytes;
      t.ops += c.ops;
    }
  return t;
}

ByteCount FlightRecorder::total_bytes() const {
  std::lock_guard lock(mu_);
  ByteCount t;
  for (const auto& [k, c] : counters_) {
    t.sent_bytes += c.sent_bytes;
    t.recv_bytes += c.recv_bytes;
    t.ops += c.ops;
  }
  return t;
}

std::map<std::pair<std::string, OpType>, ByteCount> FlightRecorder::counters() const {
  std::lock_guard lock(mu_);
  return counters_;
}

void FlightRecorder::reset_counters() {
  std::lock_guard lock(mu_);
  counters_.clear();
  last_counter_ = nullptr;
}

}  // namespace mt::comm

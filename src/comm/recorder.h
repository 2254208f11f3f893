// The flight recorder of one rank (DESIGN.md, idea 4): its last N operations and exact
// counters of bytes sent and received per group and op. The watchdog reads it to explain a
// hang; tests and the trainer's metrics read it through the same API.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "comm/types.h"

namespace mt::comm {

enum class OpState : uint8_t { kQueued, kStarted, kDone, kFailed };
std::string_view state_name(OpState s);

struct OpRecord {
  int64_t id = 0;  // per recorder, increasing
  std::string group;
  OpType op = OpType::kBarrier;
  int64_t seq = 0;
  DType dtype = DType::kF32;
  int64_t elems = 0;  // this rank's input elements (recv: the buffer's)
  int peer = -1;      // group rank of the peer (send/recv) or root (broadcast); -1 if none
  int tag = 0;
  OpState state = OpState::kQueued;
  double queued_s = 0, started_s = 0, done_s = 0;  // now_s() clock; 0 = not yet
  int64_t sent_bytes = 0, recv_bytes = 0;
};
// "all_reduce #12 on tp[1] (f32, 4096 elems)"
std::string describe(const OpRecord& r);

struct ByteCount {
  int64_t sent_bytes = 0;
  int64_t recv_bytes = 0;
  int64_t ops = 0;
};

class FlightRecorder {
 public:
  explicit FlightRecorder(int world_rank, size_t capacity = 2048)
      : world_rank_(world_rank), capacity_(capacity > 0 ? capacity : 1) {}
  int world_rank() const { return world_rank_; }

  // Writers (the Group). on_queued takes r's state kStarted (with started_s) as it is: an op
  // that runs at once on the caller's thread; any other state becomes kQueued.
  int64_t on_queued(OpRecord r);
  // on_queued without building an OpRecord: the fields written into the ring's slot in
  // place (the blocking collectives run inline, a few microseconds each for MoE's dispatch:
  // no allocation, no copy of the group's name once the slot held one).
  struct Start {
    const std::string* group = nullptr;
    OpType op = OpType::kBarrier;
    int64_t seq = 0;
    DType dtype = DType::kF32;
    int64_t elems = 0;
    int peer = -1;
    int tag = 0;
    bool started = false;  // kStarted at `at` (run inline), else kQueued
    double at = 0;         // now_s() when queued
  };
  int64_t on_queued(const Start& s);
  void on_started(int64_t id);
  void on_done(int64_t id, int64_t sent_bytes, int64_t recv_bytes);
  void on_failed(int64_t id);

  // Readers.
  std::vector<OpRecord> last(size_t n) const;  // oldest first
  std::vector<OpRecord> in_flight() const;     // queued or started, oldest first
  // The record of op `seq` of collective kind on `group`, if still held.
  bool find_collective(const std::string& group, int64_t seq, OpRecord* out) const;
  ByteCount bytes(const std::string& group, OpType op) const;
  ByteCount bytes_of_group(const std::string& group) const;
  ByteCount total_bytes() const;
  std::map<std::pair<std::string, OpType>, ByteCount> counters() const;
  void reset_counters();

 private:
  using Counters = std::map<std::pair<std::string, OpType>, ByteCount>;
  OpRecord* find_locked(int64_t id);
  OpRecord& slot_locked(int64_t id);  // the ring's slot for a new op `id`, evicting its old one
  size_t index_locked(int64_t id) const {  // id in [first_id_, next_id_): no division
    size_t i = first_slot_ + static_cast<size_t>(id - first_id_);
    return i >= capacity_ ? i - capacity_ : i;
  }
  const OpRecord& at_locked(int64_t id) const { return ring_[index_locked(id)]; }
  ByteCount& counter_locked(const std::string& group, OpType op);
  int world_rank_;
  size_t capacity_;
  mutable std::mutex mu_;
  int64_t next_id_ = 1;
  int64_t first_id_ = 1;   // the oldest op still in the ring
  size_t first_slot_ = 0;  // its slot
  // The last `capacity_` ops, ids first_id_ .. next_id_ - 1 in slots from first_slot_ on
  // (wrapping): a slot is overwritten in place (its strings keep their capacity), so a
  // recorder that filled its ring allocates nothing per op.
  std::vector<OpRecord> ring_;
  std::map<int64_t, OpRecord> evicted_;  // ops that left the ring before they were done
  Counters counters_;
  Counters::value_type* last_counter_ = nullptr;  // the counter on_done added to last
};

bool is_collective(OpType op);

}  // namespace mt::comm

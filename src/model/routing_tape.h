// Routing replay (docs/moe.md, "verify"): a router's top-k choice and the capacity's drops are
// discrete, so two layouts whose weights differ in the last bit can route a token near a tie
// differently and from then on train different models. To compare a layout with the single
// rank as the same model, `verify` records every routing decision of the layout (the chosen
// experts and the dropped assignments of each MoE layer, keyed by the microbatch's first
// sample and the layer) and the oracle replays them: its combine weights, losses and
// gradients are still its own arithmetic, only the choices are the layout's.
#pragma once

#include <climits>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

namespace mt::model {

class RoutingTape {
 public:
  // An assignment no rank has recorded yet (a cp rank records its pieces of each sequence).
  static constexpr int32_t kUnrecorded = INT32_MIN;
  struct Entry {
    std::vector<int32_t> expert;   // [n·k]; kUnrecorded where no rank has recorded it
    std::vector<uint8_t> dropped;  // [n·k] 1: dropped by the capacity
  };
  // The decisions of layer `layer` for the microbatch whose first sample is `sample`
  // (n tokens, k each; slot < 0: dropped). Several ranks may record the same microbatch
  // (tp ranks route alike; cp ranks each their own rows): the records merge assignment by
  // assignment, and one recorded differently by two ranks is an error.
  void record(int64_t sample, int layer, const int32_t* expert, const int32_t* slot, int64_t nk);
  // A cp rank's share of the microbatch: its `rows` rows (token t of its n = rows.size() is
  // row rows[t] of the whole microbatch's `whole_rows`), k assignments each.
  void record_rows(int64_t sample, int layer, const int32_t* expert, const int32_t* slot, int64_t k,
                   const std::vector<int64_t>& rows, int64_t whole_rows);
  // The record, or an error naming the key when there is none or part of it is missing.
  const Entry& find(int64_t sample, int layer, int64_t nk) const;
  size_t size() const;
  // The whole tape as int32 words (per entry: sample's low and high word, layer, nk, the nk
  // experts, the nk dropped flags), and back: merge adds another process's words as if they
  // had been recorded here (under mpirun each process records its own microbatches). merge
  // refuses words that do not parse, naming where they stop making sense.
  std::vector<int32_t> serialize() const;
  void merge(const std::vector<int32_t>& words);

 private:
  void add(int64_t sample, int layer, Entry e);
  mutable std::mutex mu_;
  std::map<std::pair<int64_t, int>, Entry> entries_;
};

// Where one microbatch's MoE layer stands with a tape (set by the model before each forward).
struct RoutingReplay {
  RoutingTape* tape = nullptr;
  bool record = false;  // true: record the decisions; false: replay them
  int64_t sample = -1;  // the microbatch's first sample; -1: neither (e.g. validation)
  int layer = -1;
  int64_t local_T = 0;  // rows of each sequence on this rank (T / cp)
  bool active() const { return tape && sample >= 0; }
};

}  // namespace mt::model

// ZeRO stages 2 and 3 (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward
// Training Trillion Parameter Models"; PyTorch FSDP, Zhao et al. 2023): gradients, and for
// stage 3 parameters, live on each rank only for its shard of the flat buffer (Shard).
// Full-size copies exist only per unit (embeddings, one block, the head) and only around
// that unit's use, in a small pool of preallocated buffers:
//
//   slot 0: unit 0 (embeddings)   slot 1: the last unit (final norm, LM head)
//   slots 2, 3: the blocks, alternating (block u in slot 2 + (u - 1) % 2)
//
// Two block slots let the next block's buffer be filled (a prefetched all-gather) or
// drained (a reduce-scatter in flight) while the current block computes. The embeddings
// keep their own slot because the tied LM head reads wte at the end of forward and at the
// start of backward. ZeRO-1 (sharded optimizer state only) needs no class of its own: a
// BucketReducer in reduce-scatter mode (data.h) plus the sharded AdamW (train/optimizer.h).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "comm/group.h"
#include "core/tensor.h"
#include "parallel/layout.h"
#include "parallel/unit_hooks.h"

namespace mt::parallel {

// One preallocated buffer per slot, each as large as the largest unit it serves.
class UnitBuffers {
 public:
  UnitBuffers(const FlatLayout& layout, mem::Category category);
  static int slot_of(int unit, int num_units);
  // Unit u's buffer: [unit_hi(u) - unit_lo(u)] elements, element e of the flat buffer at
  // e - unit_lo(u). Views of it stay valid for the buffer's whole life.
  Tensor of(int unit) const;
  int64_t total_elems() const;  // the pool, for the memory formula

 private:
  FlatLayout layout_;
  std::vector<Tensor> slots_;
};

// ZeRO-2/3 gradients. Backward writes unit u's gradients into its slot (zeroed just
// before), and as soon as the unit is done its slot is reduce-scattered in place; the
// rank's piece is added to the shard gradients when the slot is needed again or at
// finish(). So a full-size gradient buffer never exists; every microbatch reduces (with
// accumulation the volume is one reduce-scatter of Ψ per microbatch, stated in
// docs/data_parallel.md).
class ShardedGrads : public UnitHooks {
 public:
  ShardedGrads(comm::Group& dp, const FlatLayout& layout);
  Tensor unit_grads(int unit) const { return buffers_.of(unit); }
  Tensor& shard_grads() { return shard_; }  // [shard_elems]: this rank's reduced gradients
  int64_t pool_elems() const { return buffers_.total_elems(); }

  void zero_shard();  // on the rank's threads (kernels::zero) in host memory
  void before_backward(int unit) override;
  void after_backward(int unit) override;
  void finish();  // waits for every reduce-scatter and adds its piece into the shard

 private:
  struct InFlight {
    comm::WorkPtr work;
    int unit = -1;
  };
  void settle(int slot);

  comm::Group& dp_;
  FlatLayout layout_;
  Shard shard_range_;
  UnitBuffers buffers_;
  Tensor shard_;
  std::vector<std::vector<int64_t>> counts_;  // reduce-scatter counts per unit
  std::vector<InFlight> in_flight_;           // per slot
};

// ZeRO-3 parameters: this rank keeps only its shard of the values (the master copy the
// optimizer updates). Before a unit's forward, and again before its backward, its values
// are all-gathered into its slot; the next unit's gather is started (prefetch) while the
// current one computes. A slot is reused (its copy "freed") two blocks later.
class ShardedParams : public UnitHooks {
 public:
  using Ranges = std::vector<std::pair<int64_t, int64_t>>;  // flat [lo, hi), ascending
  ShardedParams(comm::Group& dp, const FlatLayout& layout);
  // --dtype bf16 (docs/mixed_precision.md, "ZeRO-3"): unit u's elements in bf16_ranges[u]
  // (the GEMM weights that nothing reads in f32) are gathered in bf16, packed in order from
  // element 0 of bf16_slots[UnitBuffers::slot_of(u)] (ParamStore::bind_bf16's packing);
  // the unit's other elements (norms, biases, the MoE router) in f32 into its slot as before,
  // where its bf16 elements are then left unwritten. Each rank rounds only its own shard's
  // part, and the GEMM weights move half the bytes. Call before the first gather.
  void gather_in_bf16(const std::vector<Ranges>& bf16_ranges,
                      const std::vector<Tensor>& bf16_slots);
  bool gathers_bf16(int unit) const;
  Tensor unit_values(int unit) const { return buffers_.of(unit); }
  Tensor& shard_values() { return shard_; }  // [shard_elems]
  int64_t pool_elems() const { return buffers_.total_elems(); }

  void before_forward(int unit) override;
  void before_backward(int unit) override;
  // Waits for and forgets any prefetch not used yet: call before the shard's values change
  // (the optimizer step), so that no gather of old values survives into the next step.
  void drop_prefetches();
  // All parameters gathered into `full` ([padded_elems]), e.g. to export the final weights.
  void gather_all(Tensor& full);

 private:
  void start(int unit);
  void wait(int unit);

  // A unit gathered in two parts (gather_in_bf16): its bf16 elements and the rest, each as
  // flat ranges with every rank's count and this rank's pieces (flat ranges of its shard).
  struct Part {
    Ranges ranges, mine;
    std::vector<int64_t> counts;
    int64_t elems = 0;  // the sum of counts
  };
  struct Split {
    Part bf16, f32;
  };
  struct Pending {
    comm::WorkPtr work, bf16_work;
    explicit operator bool() const { return work != nullptr || bf16_work != nullptr; }
  };
  Part part_of(Ranges ranges) const;
  static void forget(Pending& w);  // waits for both gathers (if any) and drops them
  void start_split(int unit);
  void land_split(int unit);  // the f32 part from its packed buffer to its places

  comm::Group& dp_;
  FlatLayout layout_;
  Shard shard_range_;
  UnitBuffers buffers_;
  Tensor shard_;
  std::vector<std::vector<int64_t>> counts_;  // all-gather counts per unit
  std::vector<Pending> pending_;              // per unit
  std::vector<Split> split_;                  // per unit, with gather_in_bf16 (else empty)
  // Per slot: the bf16 copies, and the packed send and receive buffers of a split gather.
  std::vector<Tensor> bf16_slots_, send_bf16_, send_f32_, recv_f32_;
};

}  // namespace mt::parallel

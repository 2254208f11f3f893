// DDP's gradient buckets (PyTorch DDP, Li et al. 2020, "PyTorch Distributed", section 3.2):
// the flat gradient buffer is cut into contiguous buckets in reverse parameter order, so
// that the bucket backward finishes first is reduced first, asynchronously, while the rest
// of backward runs. Used by ZeRO-0 (all-reduce) and ZeRO-1 (reduce-scatter: each rank
// keeps only its shard's reduced gradients).
#pragma once

#include <cstdint>
#include <vector>

#include "comm/group.h"
#include "core/tensor.h"
#include "parallel/layout.h"
#include "parallel/unit_hooks.h"

namespace mt::parallel {

struct Bucket {
  int64_t lo = 0, hi = 0;  // elements [lo, hi) of the flat gradient buffer
  int first_param = 0;     // the parameter holding element lo: the bucket is complete once
                           // every parameter from this one on is final
};

// Buckets covering [0, layout.padded_elems), highest elements first. A bucket grows by
// whole parameters (from the last) until it holds at least bucket_elems; its lower edge is
// then rounded down to a multiple of `align` (the DP size, so an all-reduce splits it
// evenly) — which may put a parameter's first few elements into the next bucket.
std::vector<Bucket> plan_buckets(const FlatLayout& layout, int64_t bucket_elems, int64_t align);

class BucketReducer : public UnitHooks {
 public:
  enum class Mode : uint8_t { kAllReduce, kReduceScatter };
  // grads: the full flat gradient buffer (layout.padded_elems), summed over the DP group.
  BucketReducer(comm::Group& dp, const FlatLayout& layout, Tensor grads, Mode mode,
                int64_t bucket_elems);

  // Accumulation: only the step's last microbatch reduces (earlier ones add up locally).
  void set_enabled(bool on) { enabled_ = on; }
  void after_backward(int unit) override;
  // Starts any bucket not started yet and waits for all of them. Afterwards the buffer
  // holds the sum over ranks (all-reduce) or, in this rank's shard, the sum (reduce-scatter).
  void finish();

  const std::vector<Bucket>& buckets() const { return buckets_; }

 private:
  void launch(size_t b);

  comm::Group& dp_;
  FlatLayout layout_;
  Shard shard_;
  Tensor grads_;
  Mode mode_;
  std::vector<Bucket> buckets_;
  std::vector<std::vector<int64_t>> counts_;  // reduce-scatter counts of each bucket
  std::vector<comm::WorkPtr> works_;
  size_t next_ = 0;  // the next bucket to launch
  bool enabled_ = false;
};

}  // namespace mt::parallel

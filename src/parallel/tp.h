// Tensor parallelism (Megatron-LM, Shoeybi et al. 2019) and its sequence-parallel twin
// (Korthikanti et al. 2022): the conjugate operators through which every tensor-parallel
// layer communicates, over the mesh's tp group (docs/tensor_parallel.md).
//
//   f  (before a column-parallel layer): forward identity,   backward all-reduce
//   g  (after a row-parallel layer):     forward all-reduce, backward identity
// With sequence parallelism (--sp) the residual stream is split along the tokens, and
//   f̄  forward all-gather of the rows,   backward reduce-scatter
//   ḡ  forward reduce-scatter of the rows, backward all-gather
//
// Activations are row-major [B·T, C]. The sequence shard of tp rank r is the contiguous
// rows [r·B·T/t, (r+1)·B·T/t) of the microbatch, so that an all-gather lands the pieces in
// order and no permutation is needed (with B = 1 it is exactly Megatron's split of the
// sequence). Every call goes through comm::Group, so the flight recorder counts it.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "comm/group.h"
#include "core/tensor.h"

namespace mt::parallel::tp {

// One rank's place in its tensor-parallel group. size 1 (group null): no communication.
struct TpContext {
  comm::Group* group = nullptr;
  int rank = 0;
  int size = 1;
  bool sp = false;  // sequence parallelism

  bool active() const { return size > 1; }
  static TpContext of(comm::Group& g, bool sp) { return {&g, g.rank(), g.size(), sp}; }
  // Rows of a [n, ...] activation this rank holds in the sequence-parallel region.
  int64_t local_rows(int64_t n) const { return sp ? n / size : n; }
  int64_t first_row(int64_t n) const { return sp ? rank * (n / size) : 0; }
};

// g forward / f backward: sum over the group, in place.
void all_reduce(const TpContext& tp, float* x, int64_t elems);
// f̄ forward / ḡ backward: `local` ([rows, cols], this rank's rows) into `full`
// ([size·rows, cols], rank r's rows at r·rows).
void all_gather_rows(const TpContext& tp, const float* local, float* full, int64_t local_elems);
// The same on bf16 rows (a layer-norm output stored in bf16, --dtype bf16); tp active.
void all_gather_rows(const TpContext& tp, const bf16* local, bf16* full, int64_t local_elems);
// ḡ forward / f̄ backward: sums `full` over the group and keeps this rank's rows in `local`.
void reduce_scatter_rows(const TpContext& tp, const float* full, float* local, int64_t local_elems);
// Element-wise max over the group, in place (the vocabulary-parallel softmax).
void all_reduce_max(const TpContext& tp, float* x, int64_t elems);

// Gradients of replicated parameters that each tp rank computed from its own sequence
// shard (--sp: layer norms, the position embedding) are partial sums: ReplicatedGradSync
// adds them over the tp group with one all-reduce of a packed buffer, allocated once.
class ReplicatedGradSync {
 public:
  // ranges: [begin, end) element ranges of the flat gradient buffer; lo/hi: the range of
  // the flat buffer this rank's optimizer reads, whose gradients live at grads + (e - lo).
  ReplicatedGradSync(std::vector<std::pair<int64_t, int64_t>> ranges, int64_t lo, int64_t hi);
  void sync(const TpContext& tp, float* grads);
  // The same over any group (expert parallelism: the dense parameters' gradients over ep).
  void sync(comm::Group& group, float* grads);
  int64_t elems() const { return packed_.numel(); }

 private:
  std::vector<std::pair<int64_t, int64_t>> ranges_;  // clipped to [lo, hi), relative to lo
  Tensor packed_;
};

}  // namespace mt::parallel::tp

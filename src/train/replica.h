// One rank's model and its data-parallel machinery (ZeRO stage 0-3) over the dp group:
// which full-size buffers exist, where the optimizer's shard is, and the hooks that reduce
// and gather. Used by every layout: the rank's model is the whole GPT, or its pipeline
// stage, each tensor-parallel sharded over tp.
//
//   stage 0: full values, full grads, bucketed all-reduce, AdamW on everything
//   stage 1: full values, full grads, bucketed reduce-scatter, AdamW on the shard, all-gather
//   stage 2: full values, shard grads (+ unit pool), per-unit reduce-scatter, AdamW on the
//            shard, all-gather
//   stage 3: shard values and grads (+ unit pools), per-unit all-gather before forward and
//            backward, per-unit reduce-scatter, AdamW on the shard
//
// With pipeline parallelism (`pipelined`) the schedule interleaves the microbatches, so a
// unit's gradient is final only at the end of the step: every stage keeps a full gradient
// buffer for the step and reduces it once at the end (all-reduce for stage 0,
// reduce-scatter for 1-3), after the tied embedding's gradient has been summed between the
// first and last stage. Stage 2 then saves what stage 1 does; stage 3 still shards the
// parameters (gathered per unit). This is what torchtitan does with FSDP + PP and
// Megatron-LM's distributed optimizer does with PP (docs/parallel_3d.md).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "comm/group.h"
#include "model/gpt.h"
#include "parallel/data.h"
#include "parallel/layout.h"
#include "parallel/tp.h"
#include "parallel/zero.h"
#include "train/optimizer.h"

namespace mt::train {

struct ReplicaOptions {
  int zero = 0;
  double bucket_mb = 25;
  bool pipelined = false;
  // This rank's copy of the tied wte is counted once in the gradient norm, on the first
  // stage: the last stage (not also first) skips its copy.
  bool skip_tied_copy_in_norm = false;
  // --dtype bf16: the GEMM weights get a bf16 working copy (docs/mixed_precision.md),
  // refreshed after every optimizer step (ZeRO 0-2) or after every gather of a unit
  // (ZeRO-3, into bf16 unit slots beside the f32 ones).
  bool bf16 = false;
};

parallel::FlatLayout flat_layout(const model::Gpt& gpt);

struct Replica {
  // Expert parallelism (ep_ctx active): dp_group is the expert-data-parallel group (the
  // ranks holding the same experts: dp / ep, x cp), over which gradients are reduced and
  // ZeRO shards as usual; the ep ranks are data parallel for every other (dense) parameter,
  // whose gradients are then also summed over `ep_grads` (the ep ranks, a group of its own
  // so that the ep group counts only the tokens' all-to-alls), like the tp-replicated ones
  // over tp. Dense parameters count in the norm on ep rank 0 only.
  Replica(const model::GptConfig& config, uint64_t seed, const AdamWConfig& adamw,
          const ReplicaOptions& ro, comm::Group& dp_group, parallel::tp::TpContext tp_ctx = {},
          model::StageParts parts = {}, parallel::ep::EpContext ep_ctx = {},
          comm::Group* ep_grads = nullptr);

  // Squared norm of this rank's owned gradients: each element of the padded flat buffer is
  // owned by exactly one dp rank; a tp-replicated parameter counts on tp rank 0 only, the
  // tied wte copy of the last stage not at all. The sum over all ranks is the model's.
  double owned_norm_sq();

  void begin_step();
  void begin_microbatch(bool last);
  void end_backward();
  // This rank's reduced gradients (the owned shard).
  float* owned_grads();
  int64_t owned_elems() const { return shard.shard_elems; }
  // Everything this rank's optimizer reads.
  float* opt_grads();
  float* opt_values();
  int64_t opt_elems() const { return opt_hi - opt_lo; }
  // grad_scale: global-norm clipping's factor, applied as the update reads the gradients.
  void optimizer_step(float lr, float grad_scale = 1.0f);
  // ZeRO-3: gathers the final weights into a full buffer and points the views there (for
  // export and the tests); the hooks are off from here on.
  void materialize_full();
  const float* full_values() { return values ? full.f32() : gpt.params().flat_values().f32(); }

  comm::Group& dp;
  ReplicaOptions options;
  int zero;
  model::Gpt gpt;
  parallel::FlatLayout layout;
  parallel::Shard shard;
  std::unique_ptr<parallel::BucketReducer> buckets;
  std::unique_ptr<parallel::ShardedGrads> grads;
  std::unique_ptr<parallel::ShardedParams> values;
  std::unique_ptr<parallel::HookChain> chain;
  std::unique_ptr<AdamW> opt;
  // Stage 0 with bf16: the optimizer writes the GEMM weights' bf16 copy in its own pass
  // (AdamW::write_bf16_copies), so optimizer_step does not convert the values again.
  bool bf16_in_optimizer = false;
  int64_t opt_lo = 0, opt_hi = 0;
  Tensor full;
  // Flat ranges not counted in the norm on this rank: tp-replicated parameters on tp ranks
  // other than 0, the last stage's tied wte copy. Sorted, disjoint.
  std::vector<std::pair<int64_t, int64_t>> uncounted;
  std::unique_ptr<parallel::tp::ReplicatedGradSync> tp_sync;
  // --ep: the dense parameters' gradients summed over the ep ranks.
  comm::Group* ep_grads = nullptr;
  std::unique_ptr<parallel::tp::ReplicatedGradSync> ep_sync;
  // ZeRO-3 with bf16: the bf16 copies of the gathered units (one slot per f32 slot, as
  // large as the GEMM weights of the largest unit it serves), and the hook that converts a
  // unit's gathered values into them.
  std::vector<Tensor> bf16_slots;
  std::unique_ptr<parallel::UnitHooks> bf16_refresh;
  Tensor full_bf16;                  // materialize_full's
  int64_t bf16_param_elems() const;  // this rank's bf16 copy (full, or the ZeRO-3 slots)
};

}  // namespace mt::train

// The GPT-2 model of one rank: embeddings, blocks, final norm, tied LM head and the
// fused cross-entropy, with an explicit forward and backward over one microbatch.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/layers.h"
#include "model/params.h"
#include "parallel/tp.h"
#include "parallel/unit_hooks.h"

namespace mt::model {

// Everything one microbatch's backward needs, allocated once and reused.
struct Activations {
  int64_t B = 0, T = 0;
  std::vector<int32_t> targets;
  std::vector<int32_t> tokens;
  Tensor encoded;  // [N, C] embedding output = first block's input
  std::vector<BlockActivations> blocks;
  Tensor lnf, lnf_mean, lnf_rstd;  // [N, C], [N], [N]
  Tensor logits;                   // [N, Vp]; turned into d(logits) in place by backward
  Tensor losses, lse;              // [N]
  // Tensor parallelism: logits are this rank's [N, Vp/t] columns; the vocabulary-parallel
  // cross-entropy's row maxima and (sum-exp, target logit) pairs; with --sp the gathered
  // final-norm output [N, C] the LM head reads (lnf holds this rank's rows).
  Tensor ce_max, ce_sums;  // [N], [2N]
  Tensor lnf_full;
};

// The model's units, in forward order, are what data parallelism gathers and reduces
// (parallel/unit_hooks.h): unit 0 the embeddings (wte, wpe), units 1..L the blocks, unit
// L + 1 the head (final norm, and lm_head when untied). Each unit is a consecutive range
// of parameters.
class Gpt {
 public:
  // tp: this rank's tensor-parallel group (size 1: none). The store then holds this rank's
  // slices (tp_shard_specs), each drawn from the global stream; the vocabulary is padded to
  // a multiple of lcm(128, t) (config.vocab_pad_multiple is set here).
  Gpt(const GptConfig& config, uint64_t seed, StoreOptions store = {},
      parallel::tp::TpContext tp = {});

  const GptConfig& config() const { return config_; }
  const parallel::tp::TpContext& tp() const { return tp_; }
  ParamStore& params() { return params_; }
  const ParamStore& params() const { return params_; }

  int num_units() const { return static_cast<int>(config_.n_layer) + 2; }
  // n_units + 1 entries: unit u is parameters [v[u], v[u + 1]).
  std::vector<int> unit_first_params() const;
  // With --sp, the parameters whose gradients each tp rank computes from its own sequence
  // shard only, partial sums to be added over the tp group (parallel::tp::
  // ReplicatedGradSync): the layer norms and the position embedding. (Row-parallel biases
  // take their gradient from the gathered output gradient: already the full sum.)
  std::vector<int> sequence_parallel_params() const;
  // Called around every unit's forward and backward (null: none).
  void set_hooks(parallel::UnitHooks* hooks) { hooks_ = hooks; }

  Activations make_activations(int64_t B, int64_t T) const;
  // Mean loss over the B*T tokens; keeps in `a` what backward needs.
  float forward(Activations& a, const int32_t* inputs, const int32_t* targets);
  // Accumulates into the gradients d(sum_i dloss * loss_i)/d(params), i over the tokens of
  // the microbatch. dloss = 1 / (tokens in the whole step) gives the mean over a step.
  // With tied embeddings the LM head's weight gradient is added at the end, with the
  // embedding's, so that after each unit's backward every gradient of that unit and of the
  // later units is final (what UnitHooks::after_backward promises).
  void backward(Activations& a, float dloss);

 private:
  void ensure_scratch(int64_t B, int64_t T);
  float forward_tp(Activations& a);
  void backward_tp(Activations& a, float dloss);

  GptConfig config_;
  ParamStore params_;
  Param* wte_ = nullptr;
  Param* wpe_ = nullptr;
  Param* lm_head_ = nullptr;  // = wte_ when tied
  LayerNorm ln_f_;
  std::vector<Block> blocks_;
  BlockScratch scratch_;
  Tensor dres_;  // [N, C] gradient of the residual stream
  int64_t scratch_tokens_ = 0;
  parallel::UnitHooks* hooks_ = nullptr;
  parallel::UnitHooks no_hooks_;
  parallel::tp::TpContext tp_;
};

// Training FLOPs per token (forward + backward, no recomputation): see docs/flops.md.
double training_flops_per_token(const GptConfig& c, int64_t T);

}  // namespace mt::model

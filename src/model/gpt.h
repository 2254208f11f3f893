// The GPT-2 model of one rank: embeddings, blocks, final norm, tied LM head and the
// fused cross-entropy, with an explicit forward and backward over one microbatch.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/layers.h"
#include "model/params.h"

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
};

class Gpt {
 public:
  Gpt(const GptConfig& config, uint64_t seed);

  const GptConfig& config() const { return config_; }
  ParamStore& params() { return params_; }
  const ParamStore& params() const { return params_; }

  Activations make_activations(int64_t B, int64_t T) const;
  // Mean loss over the B*T tokens; keeps in `a` what backward needs.
  float forward(Activations& a, const int32_t* inputs, const int32_t* targets);
  // Accumulates into the gradients d(sum_i dloss * loss_i)/d(params), i over the tokens of
  // the microbatch. dloss = 1 / (tokens in the whole step) gives the mean over a step.
  void backward(Activations& a, float dloss);

 private:
  void ensure_scratch(int64_t B, int64_t T);

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
};

// Training FLOPs per token (forward + backward, no recomputation): see docs/flops.md.
double training_flops_per_token(const GptConfig& c, int64_t T);

}  // namespace mt::model

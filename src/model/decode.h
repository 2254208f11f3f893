// Generation with a key/value cache: the model run one position at a time, each block
// keeping the keys and values of every earlier position, so that a token costs one
// position's forward (its attention reads the cache) instead of the whole prefix's. The
// whole model on one rank (no tensor or pipeline parallelism), f32 weights; the CPU only.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "model/gpt.h"
#include "model/moe.h"

namespace mt::model {

class Decoder {
 public:
  // max_len: positions the cache holds, at most the model's seq_len (its position table).
  Decoder(const Gpt& gpt, int64_t max_len);

  int64_t position() const { return pos_; }  // positions fed so far
  int64_t max_len() const { return max_len_; }
  const GptConfig& config() const { return gpt_.config(); }
  void reset() { pos_ = 0; }
  // Feeds `token` at the next position; returns the logits of the token after it
  // ([vocab], the padding dropped), valid until the next call.
  const float* step(int32_t token);

 private:
  const Gpt& gpt_;
  int64_t max_len_ = 0, pos_ = 0;
  // One position's buffers, and per block the cache: [max_len, kv_heads·hd] keys and values.
  Tensor x_, ln_, qkv_, atty_, branch_, fch_, act_, logits_, scores_;
  // MoE blocks: one token's routing and expert buffers (model/moe.h).
  MoeActivations moe_;
  MoeScratch moe_scratch_;
  std::vector<Tensor> k_cache_, v_cache_;
};

}  // namespace mt::model

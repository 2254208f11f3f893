// Choosing the next token from logits (temperature, top-k, a seeded draw), and generation
// with it: through the KV cache (model/decode.h, one position's forward per token), or by
// running the whole prefix through Gpt::forward for every token (the reference the cache is
// tested against, and the O(N²) cost it saves: `meshtrain sample --no-cache`).
#pragma once

#include <cstdint>
#include <vector>

#include "model/decode.h"
#include "model/gpt.h"

namespace mt::model {

struct SampleOptions {
  double temperature = 1.0;  // <= 0: the argmax (greedy)
  int64_t top_k = 0;         // 0: the whole vocabulary
  uint64_t seed = 0;
};

// The token drawn from softmax(logits / temperature) over the top_k largest logits (ties
// broken by the lower id), with the uniform number rng::uniform(seed, "sample", draw): the
// same logits, options and draw give the same token. Probabilities in double.
int32_t sample_token(const float* logits, int64_t vocab, const SampleOptions& o, uint64_t draw);

// The lowest id of the largest logit.
int32_t argmax_token(const float* logits, int64_t vocab);

// `n` tokens after `prompt` (not empty), draw i for the i-th. The prompt and the result
// together must fit the model's seq_len.
std::vector<int32_t> generate(Decoder& d, const std::vector<int32_t>& prompt, int64_t n,
                              const SampleOptions& o);
std::vector<int32_t> generate_uncached(Gpt& gpt, const std::vector<int32_t>& prompt, int64_t n,
                                       const SampleOptions& o);

}  // namespace mt::model

// Rotary position embeddings: the frequencies of a config (rope_theta, and Llama 3.1's
// rope_scaling) and the cos/sin tables the kernels read (kernels.h rope_forward).
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace mt::model {

// inv_freq[i] = theta^(-2i/hd), i < hd/2, then Llama 3's scaling when the config has it
// (Hugging Face's _compute_llama3_parameters): wavelengths above original/low_freq_factor
// divided by factor, below original/high_freq_factor kept, blended in between. In double.
std::vector<double> rope_inv_freq(const GptConfig& c);

// cos and sin of pos·inv_freq[i] for pos < T: [T, hd/2] each, f32, on the calling thread's
// device (angles and their cos/sin in double, then rounded once).
struct RopeTables {
  Tensor cos, sin;
};
RopeTables make_rope_tables(const GptConfig& c, int64_t T);
// Row t at position positions[t] (a rank's local rows under context parallelism).
RopeTables make_rope_tables(const GptConfig& c, const std::vector<int32_t>& positions);

}  // namespace mt::model

// Counter-based random numbers (Philox4x32-10, Salmon et al. 2011). The output depends
// only on (seed, stream, index): no hidden state, so any rank can draw exactly the
// numbers of its own slice of a global tensor (DESIGN.md, idea 2: layout independence).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace mt::rng {

// Four 32-bit words for counter block `counter` of (seed, stream).
std::array<uint32_t, 4> philox4x32(uint64_t seed, uint64_t stream, uint64_t counter);

// A stable 64-bit stream id for a name (FNV-1a), e.g. a parameter's name.
uint64_t stream_of(std::string_view name);

// Element `index` of the uniform [0, 1) sequence of (seed, stream).
float uniform(uint64_t seed, uint64_t stream, uint64_t index);
// Element `index` of the standard normal sequence of (seed, stream) (Box-Muller; elements
// 2k and 2k+1 share one counter block).
float normal(uint64_t seed, uint64_t stream, uint64_t index);

// out[i] = mean + std * normal(seed, stream, first_index + i), for i in [0, n).
void fill_normal(float* out, int64_t n, uint64_t seed, uint64_t stream, uint64_t first_index,
                 float mean, float std);

}  // namespace mt::rng

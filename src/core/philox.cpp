#include "core/philox.h"

#include <cmath>

namespace mt::rng {

std::array<uint32_t, 4> philox4x32(uint64_t seed, uint64_t stream, uint64_t counter) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = static_cast<uint32_t>(stream), c3 = static_cast<uint32_t>(stream >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(kMul0) * c0;
    uint64_t p1 = static_cast<uint64_t>(kMul1) * c2;
    uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    k0 += kWeyl0, k1 += kWeyl1;
  }
  return {c0, c1, c2, c3};
}

uint64_t stream_of(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

namespace {
// 24 random bits -> (0, 1]; never 0, so log() below is finite.
double open_unit(uint32_t x) { return ((x >> 8) + 1) * (1.0 / 16777216.0); }

float box_muller(const std::array<uint32_t, 4>& w, bool second) {
  double r = std::sqrt(-2.0 * std::log(open_unit(w[0])));
  double theta = 6.283185307179586 * open_unit(w[1]);
  return static_cast<float>(second ? r * std::sin(theta) : r * std::cos(theta));
}
}  // namespace

float uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  auto w = philox4x32(seed, stream, index / 4);
  return static_cast<float>((w[index % 4] >> 8) * (1.0 / 16777216.0));
}

float normal(uint64_t seed, uint64_t stream, uint64_t index) {
  return box_muller(philox4x32(seed, stream, index / 2), index % 2);
}

void fill_normal(float* out, int64_t n, uint64_t seed, uint64_t stream, uint64_t first_index,
                 float mean, float std) {
  for (int64_t i = 0; i < n;) {
    uint64_t idx = first_index + static_cast<uint64_t>(i);
    auto w = philox4x32(seed, stream, idx / 2);
    for (uint64_t j = idx % 2; j < 2 && i < n; ++j, ++i) out[i] = mean + std * box_muller(w, j);
  }
}

}  // namespace mt::rng

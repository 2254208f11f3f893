#include "train/sample_order.h"

#include "core/error.h"
#include "core/philox.h"

namespace mt::train {

namespace {

// The Philox stream of the sample order, apart from every parameter's (stream_of(name)).
const uint64_t kOrderStream = rng::stream_of("meshtrain.sample_order");
constexpr int kRounds = 6;  // a Feistel network of >= 4 rounds is a pseudorandom permutation

}  // namespace

int64_t permuted_index(uint64_t seed, uint64_t epoch, int64_t i, int64_t n) {
  MT_ASSERT(n >= 1 && i >= 0 && i < n);
  if (n == 1) return 0;
  // The domain: 2^(2h) >= n, split into two halves of h bits (at most 4n values, so the walk
  // below takes fewer than 4 steps on average).
  int h = 1;
  while ((uint64_t{1} << (2 * h)) < static_cast<uint64_t>(n)) ++h;
  const uint64_t mask = (uint64_t{1} << h) - 1;
  // One round key per (epoch, round), from Philox keyed by the seed.
  uint32_t keys[kRounds];
  for (int r = 0; r < kRounds; r += 2) {
    const auto w = rng::philox4x32(seed, kOrderStream, epoch * (kRounds / 2) + r / 2);
    keys[r] = w[0];
    keys[r + 1] = w[1];
  }
  auto feistel = [&](uint64_t x) {
    uint64_t left = x >> h, right = x & mask;
    for (int r = 0; r < kRounds; ++r) {
      // The round function: Philox of (key, right half), a counter-based hash.
      const auto f = rng::philox4x32(keys[r], kOrderStream + 1, right);
      const uint64_t mixed = (uint64_t{f[0]} | uint64_t{f[1]} << 32) & mask;
      const uint64_t next = left ^ mixed;
      left = right;
      right = next;
    }
    return left << h | right;
  };
  // Cycle walking: apply the permutation of [0, 4^h) until the value falls in [0, n); as a
  // permutation's cycles pass through [0, n), this is a permutation of [0, n).
  uint64_t x = static_cast<uint64_t>(i);
  do x = feistel(x);
  while (x >= static_cast<uint64_t>(n));
  return static_cast<int64_t>(x);
}

int64_t SampleOrder::sample(int64_t global_index, int64_t n) const {
  MT_ASSERT(n >= 1 && global_index >= 0);
  const int64_t epoch = global_index / n, i = global_index % n;
  return shuffle ? permuted_index(seed, static_cast<uint64_t>(epoch), i, n) : i;
}

}  // namespace mt::train

// The order in which training samples are read (`train --shuffle`, docs/data.md): epoch e of
// a split of n samples reads them in a seeded permutation of [0, n), and global sample index
// g is position g mod n of epoch g / n. The permutation is a pure function of (seed, epoch,
// position): no state, no table (a Feistel network over the next power of four, walking
// cycles back into [0, n)), so every rank of every layout computes the sample of any global
// index by itself, the same one (DESIGN.md idea 2), and a resume at step s reads exactly
// what the uninterrupted run read there.
#pragma once

#include <cstdint>

namespace mt::train {

struct SampleOrder {
  bool shuffle = false;  // false: sample g is g mod n (file order, llm.c's batches)
  uint64_t seed = 0;

  // The sample (in [0, n)) that global index `global_index` >= 0 reads, of n >= 1 samples.
  int64_t sample(int64_t global_index, int64_t n) const;
};

// Position `i` of epoch `epoch`'s permutation of [0, n): a bijection of [0, n) for each
// (seed, epoch), different from epoch to epoch.
int64_t permuted_index(uint64_t seed, uint64_t epoch, int64_t i, int64_t n);

}  // namespace mt::train

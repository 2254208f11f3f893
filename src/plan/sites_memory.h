// The planner's memory model of a DiLoCo run (train --sites, docs/diloco.md "Memory"): a site
// is a job of dp / S ranks on B / S sequences (ZeRO shards within it, each rank the same
// microbatches as without sites), and every rank keeps besides its site's model states the
// outer state of its shard of the site's flat parameters (train/outer_optimizer.h), in f32:
//
//   n = Ψ_rank / (dp / S / ep x cp)         the rank's shard (Ψ_rank: its stage's parameters
//                                            per tp rank, its experts only with ep)
//   optimizer      += 4 n (outer parameters) + 4 n (Nesterov's momentum; average: none)
//   communication  += f32 exchange: 4 m (m the largest fragment's elements of the shard)
//                     bf16 / int8: 4 (S c + 2 S w + c), c = ceil(m / S) rounded up to 128
//                     (a site's chunk), w its encoded words (bf16 c / 2, int8 c / 128 + c / 4)
//                     --outer-delay: + 4 n (the pseudo-gradients in flight)
//   with --ep E:       the d dense elements of the shard padded to E slices of ceil(d / E):
//                     m and the delay's n become n - d + E ceil(d / E), the compressed
//                     chunk is cut from n - d + ceil(d / E) (what is sent), and
//                     + 4 E ceil(d / E) (the slices gathered inside the site). d is the
//                     stage's dense share of the shard (exact without ZeRO; with ZeRO the
//                     shard's cut is taken as proportional).
//
// m = n with one fragment; with --outer-fragments F the model counts m = n, an upper bound
// (the largest fragment's share of the shard depends on where the units fall in it).
#pragma once

#include <string>
#include <vector>

#include "plan/planner.h"

namespace mt::plan {

struct OuterMemory {
  int sites = 1;
  bool momentum = true;           // --outer-optimizer nesterov
  std::string compress = "none";  // --outer-compress
  bool delay = false;             // --outer-delay > 0
};

// The outer state of one rank whose shard of the site's flat parameters has `n` elements,
// `dense` of them (with --ep E > 1) the dense ones its ep ranks share.
MemoryBytes outer_state_bytes(double n, const OuterMemory& o, double dense = 0, int ep = 1);

// memory_by_stage of the layout `l` (its dp the job's) trained in o.sites sites (S must divide
// dp, and ep dp / S): per pipeline stage, one rank of a site with its outer state.
// `outer`, if given, receives each stage's outer state alone (outer_state_bytes).
std::vector<MemoryBytes> memory_by_stage_in_sites(const Job& j, const Layout& l,
                                                  const OuterMemory& o,
                                                  std::vector<MemoryBytes>* outer = nullptr);

}  // namespace mt::plan

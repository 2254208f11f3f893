// Expert parallelism (GShard, Lepikhin et al. 2020; Megatron-Core's token dispatcher): the
// E routed experts of every MoE layer are split over the mesh's ep group, ep rank r holding
// experts [r·E/ep, (r+1)·E/ep). Each rank routes its own tokens over all E experts, then
//
//   dispatch: every kept (token, expert) row goes to the rank holding its expert: one
//             all_to_all_v of rows (expert-sorted rows are already grouped by owner);
//   experts:  the received rows regrouped by local expert (source-major -> expert-major),
//             each local expert's rows one GEMM;
//   combine:  the outputs regrouped back and returned by the reverse all_to_all_v.
//
// Backward runs the same two exchanges for the output and input gradients. The ep group is
// carved from dp (Megatron-Core's "parallel folding", docs/moe.md): the ep ranks are data
// parallel for everything but the experts. The row counts travel first (an all_to_all of
// E/ep i32 counts per peer), so a rank that routes nothing, or receives nothing for an
// expert, takes part like any other.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/group.h"

namespace mt::parallel::ep {

struct EpContext {
  comm::Group* group = nullptr;
  int rank = 0;
  int size = 1;
  bool active() const { return size > 1; }
  static EpContext of(comm::Group& g) { return {&g, g.rank(), g.size()}; }
};

// One microbatch's exchange in one MoE layer, from the counts of both sides.
struct Exchange {
  int ranks = 1;
  int64_t local_experts = 0;         // E / ep
  std::vector<int64_t> send_rows;    // [ep]: rows sent to each rank
  std::vector<int64_t> recv_rows;    // [ep]: rows received from each rank
  std::vector<int64_t> table;        // [ep][E/ep]: rows from source s for local expert e
  std::vector<int64_t> expert_rows;  // [E/ep]: rows of each local expert (sum over sources)
  int64_t received = 0;
};

// Collective over the ep group: `counts` [E] are this rank's kept rows per global expert,
// in expert order (what route() counted). Exchanges the per-expert counts.
Exchange plan_exchange(const EpContext& ep, const std::vector<int64_t>& counts, int64_t experts);

// Shadow experts (FasterMoE, He et al., PPoPP 2022), --moe-shadow: when the routing piles
// rows onto the experts of one rank, that rank's experts run while the others wait. A
// shadowed expert's weights go to every ep rank instead (one all_gather), each rank runs its
// own rows of it, and the weight gradients come back to the owner summed (one
// reduce_scatter): its rows never travel and its work is split by where the tokens are.
//
// Which experts, from every rank's kept rows per expert `all` ([ep][E], the same on every
// rank, so every rank chooses alike): a rank's load is the rows it computes (its
// unshadowed experts' rows from every rank, plus its own rows of every shadowed expert).
// While the heaviest rank's load is above `above` x the mean, shadow its unshadowed expert
// with the most rows from other ranks, if that lowers the heaviest load; at most E/ep
// experts (a rank holds at most E/ep foreign copies). Returns [E], 1 for shadowed.
std::vector<uint8_t> choose_shadows(const std::vector<int64_t>& all, int ranks, int64_t experts,
                                    double above);

// Collective: gathers every rank's kept rows per expert (`counts`, [E]), chooses the shadows
// (choose_shadows) into `shadowed`, and plans the exchange of the rows that still travel
// (a shadowed expert's rows counted as 0: they stay where they are).
Exchange plan_exchange_shadowed(const EpContext& ep, const std::vector<int64_t>& counts,
                                int64_t experts, double above, std::vector<uint8_t>& shadowed);

// The most rows a rank can receive in one layer for n local tokens, top_k each, with
// per-expert capacity `capacity` (0: dropless): a token sends at most min(k, E/ep) rows to
// one rank, and a capacity bounds each expert's rows from each source.
int64_t max_received_rows(int ranks, int64_t n, int64_t top_k, int64_t experts, int64_t capacity);

// Rows of width `width` (f32) sent as the exchange says: `out` of this rank's expert-sorted
// rows to their owners, arriving source-major in `in` (forward: dispatch). reverse: the
// other way, source-major rows back to where they came from (combine).
void exchange_rows(const EpContext& ep, const Exchange& x, const float* send, float* recv,
                   int64_t width, bool reverse);

// Source-major <-> expert-major (the received rows grouped by local expert, sources in
// order within each): a permutation of whole rows.
void to_expert_major(const Exchange& x, const float* source_major, float* expert_major,
                     int64_t width);
void to_source_major(const Exchange& x, const float* expert_major, float* source_major,
                     int64_t width);

}  // namespace mt::parallel::ep

// Context parallelism (docs/context_parallel.md): every sequence is split across the cp
// ranks of the mesh, and attention is the only layer that needs tokens of other ranks.
//
// The causal load-balanced split (Megatron-LM's and Llama 3's): the T positions are cut into
// 2N chunks of c = T / 2N, and cp rank i holds chunks i and 2N − 1 − i, in that order, as its
// local sequence of 2c rows. Under a causal mask chunk k attends to k + 1 chunks, so every
// rank attends to (i + 1) + (2N − i) = 2N + 1 chunks: the same work on every rank.
//
// How a rank's queries get the keys and values they need (--cp-comm); K|V always travel as
// the kv heads are (grouped-query heads are never repeated: the kernel reads head h's k and v
// from kv head h / group):
//   ring (default): each rank's K|V block goes around the ring point to point, the next
//               block's transfer posted before the current block's attention (overlap);
//               the pieces are merged by their log-sum-exp. Backward sends the blocks round
//               again with their dK|dV, each rank adding its share; after N steps every
//               block's gradient is home.
//   all-gather: the local K|V all-gathered over cp per layer, placed in global order, and
//               each local chunk attends to the keys before it; backward gathers them again
//               and reduce-scatters dK|dV.
//   a2a:        DeepSpeed-Ulysses: an all-to-all turns the sequence split into a head split
//               (rank r gets head group r's q | k | v of every position), the kernel runs
//               on whole sequences, and a second all-to-all returns the outputs; the heads
//               (and kv heads) per tp rank must divide by N.
// Every call goes through comm::Group on the mesh's cp group (the flight recorder counts
// the bytes) and is timed under the profile name `cp.comm`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/group.h"

namespace mt::parallel::cp {

enum class CpComm : uint8_t { kRing, kAllGather, kA2a };
CpComm parse_cp_comm(const std::string& name);  // "ring", "all-gather", "a2a"
const char* cp_comm_name(CpComm c);

// One rank's place in its context-parallel group. size 1 (group null): the whole sequence.
struct CpContext {
  comm::Group* group = nullptr;
  int rank = 0;
  int size = 1;
  CpComm comm = CpComm::kRing;
  // A test switch: the plain split (rank i holds positions [i·T/N, (i+1)·T/N)) instead of
  // the causal load-balanced one, to measure the imbalance it avoids. Never in training.
  bool contiguous = false;

  bool active() const { return size > 1; }
  static CpContext of(comm::Group& g, CpComm c) { return {&g, g.rank(), g.size(), c, false}; }
  // Local rows of a sequence of T global positions.
  int64_t local_len(int64_t T) const { return T / size; }
  // The local sequence in pieces of contiguous positions: 2 chunks of T/2N (1 piece of T/N
  // with `contiguous`).
  int pieces() const { return contiguous || size == 1 ? 1 : 2; }
  int64_t piece_len(int64_t T) const { return local_len(T) / pieces(); }
  // Global position of the first row of piece k of rank r's local sequence.
  int64_t piece_start(int64_t T, int k, int r) const;
  int64_t piece_start(int64_t T, int k) const { return piece_start(T, k, rank); }
  // Global position of local row t (0 <= t < local_len(T)) of rank r.
  int64_t position(int64_t T, int64_t t, int r) const;
  int64_t position(int64_t T, int64_t t) const { return position(T, t, rank); }
  // The global positions of this rank's local rows, in order.
  std::vector<int32_t> positions(int64_t T) const;
};

// Refusals before any work: T not divisible by 2N (N with `contiguous`), naming the values.
void check_split(int64_t T, int cp);
// a2a: the query and kv heads of a tp rank must divide by cp; refused naming the cp values
// that work (T: the sequence, which 2·cp must divide too).
void check_a2a(int64_t heads, int64_t kv_heads, int64_t T, int cp);

// The attention of one layer's local queries over the whole sequence's keys and values.
// Layout (per rank, B sequences of Tl = T / N local rows): qkv [B·Tl, qkv_ld] holds the
// rank's q (heads·hd columns from 0) and k | v (kv_heads·hd each, from kv_col), rotated;
// out [B·Tl, heads·hd]; lse [B, heads, Tl]. Query head h reads kv head h / (heads/kv_heads).
struct AttentionShape {
  int64_t B = 0, T = 0;  // sequences, global positions
  int64_t heads = 0, kv_heads = 0, hd = 0;
  int64_t qkv_ld = 0;  // floats between rows of qkv (and of dqkv)
  int64_t kv_col = 0;  // first column of k (v follows kv_heads·hd later)
};

// Workspace of the exchange (one set per rank, shared by the layers). W = 2·kv_heads·hd.
//   all-gather: local [B·Tl, W] this rank's k | v packed, then its dk | dv;
//               ranked [N, B·Tl, W] every rank's, in rank order;
//               kv, dkv [B, T, W] k | v of every position (global order) and their gradient;
//               o, lse unused.
//   ring:       local, ranked [B·Tl, W] the block in hand and the one arriving;
//               kv, dkv [B·Tl, W] the dk | dv of the block in hand and of the one arriving;
//               o [B·Tl, heads·hd], lse [B, heads, Tl] one piece's result before the merge.
//   a2a:        local, ranked [N, B·Tl, Wg] the all-to-all's send and receive buffers
//               (Wg = (heads + 2·kv_heads)/N·hd, a head group's q | k | v);
//               kv, dkv [B, T, Wg] the head group's q | k | v of every position and their
//               gradient; o [2, B, T, heads/N·hd] its outputs and their gradient; lse unused
//               (the head group's lse, [B, heads/N, T], is the layer's own).
struct Workspace {
  float* local = nullptr;
  float* ranked = nullptr;
  float* kv = nullptr;
  float* dkv = nullptr;
  float* o = nullptr;
  float* lse = nullptr;
};
struct WorkspaceElems {
  int64_t local = 0, ranked = 0, kv = 0, dkv = 0, o = 0, lse = 0;
};
WorkspaceElems workspace_elems(const CpContext& cp, const AttentionShape& s);

// o and lse of the local queries (overwritten).
void attention_forward(const CpContext& cp, const AttentionShape& s, const float* qkv, float* out,
                       float* lse, const Workspace& w);
// Writes d(q) into dqkv's q columns and d(k) | d(v) into its kv columns (overwritten): the
// local rows' share summed over every rank's queries. out and lse: the forward's.
void attention_backward(const CpContext& cp, const AttentionShape& s, const float* qkv,
                        const float* out, const float* lse, const float* dout, float* dqkv,
                        const Workspace& w);

// The kernel's (query block, key block) pairs of this rank's forward per layer (the work
// of its attention), summed over (b, head): the balance of the split (tests, docs).
int64_t attention_block_pairs(const CpContext& cp, const AttentionShape& s);

}  // namespace mt::parallel::cp

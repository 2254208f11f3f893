// How a layout places the model (internal to src/plan/): the bytes of a value and of a
// gradient per dtype, whose executor keeps what, the layers per pipeline chunk and rank, and
// the parameters a chunk or a pipeline rank holds. Shared by the memory model (memory.cpp) and
// the time model (planner.cpp).
#pragma once

#include <string>
#include <vector>

#include "plan/planner.h"

namespace mt::plan {

inline bool mixed(const Job& j) { return j.dtype != "f32"; }
// Our runtime's executor keeps a spare receive set (measured to the byte in f32);
// Megatron-LM's receives into p2p tensors (docs/planner.md).
inline bool spare_set(const Job& j) { return runs_our_runtime(j); }
// Dropout's masks and outputs: Megatron-LM's GPT recipes; our runtime has none.
inline bool dropout(const Job& j) { return j.model.dropout && !runs_our_runtime(j); }
inline double weight_bytes(const Job& j) { return mixed(j) ? 2 : 4; }
// Gradients as kept and reduced: fp16 in fp16 (the ZeRO paper's 2Ψ), bf16 in fp32 (Megatron-LM
// forces accumulate_allreduce_grads_in_fp32 for bf16: "bfloat16 requires gradient accumulation
// and all-reduce to be done in fp32"; DeepSpeed's bf16 optimizer likewise), f32 in f32.
inline double gradient_bytes(const std::string& dtype) { return dtype == "fp16" ? 2 : 4; }
inline double gradient_bytes(const Job& j) { return gradient_bytes(j.dtype); }

// How the layers sit on the pipeline: per chunk, and per rank (chunks r, r + pp, ...: the
// schedule IR's rank_of_chunk).
struct Split {
  std::vector<int> chunk;     // pp·v entries
  std::vector<int> rank;      // per pipeline rank, the sum of its chunks
  std::vector<int> rank_max;  // per pipeline rank, its largest chunk
  int busiest = 0;            // the most layers on one rank
};

Split split_of(const Job& j, const Layout& l);
// Parameters of pipeline chunk c (model order; before ZeRO), per TP rank.
double chunk_params(const Job& j, const Layout& l, const Split& split, int c);
// Parameters held by pipeline rank r (before ZeRO), per TP rank: its chunks r, r + pp, ...
double stage_params(const Job& j, const Layout& l, const Split& split, int r);
// A tp group is tp consecutive ranks: inside one node when tp divides a node's GPUs, or
// when the whole job is one node.
bool tp_fits_nodes(const Job& j, int tp);

}  // namespace mt::plan

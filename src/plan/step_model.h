// The step model's pieces that `estimate` and the layout search (search.cpp) share: one
// layer's pass costs, a layout prepared for the pipeline replay (the costs that do not
// depend on the schedule's order), the replay itself, the search's lower bound and the
// estimate's last figures. planner.cpp holds them; nothing outside plan/ includes this.
#pragma once

#include <cstdint>
#include <vector>

#include "plan/pipeline.h"
#include "plan/planner.h"
#include "plan/stages.h"

namespace mt::plan::step_model {

struct PassCosts {
  double fwd = 0, bwd = 0;  // per layer per microbatch, compute + exposed TP comm
  double bwd_plain = 0;     // bwd without recomputation
  double tp_fwd = 0, tp_bwd = 0;
  double cp_fwd = 0, cp_bwd = 0;          // ring attention's exposed transfers
  double ep_fwd = 0, ep_bwd = 0;          // MoE all-to-alls (plan/moe.h), not overlapped
  double moe_tp_fwd = 0, moe_tp_bwd = 0;  // Megatron-Core's expert-tp gather and scatter
  double head_fwd = 0, head_bwd = 0;      // last stage
  double embed_fwd = 0, embed_bwd = 0;
  double vocab_first = 0, vocab_last = 0;  // the tp collectives in embed_* and head_* (a pass pair)
};

struct Prepared {
  PassCosts pc;  // per layer
  Split split;
  double p2p = 0;
  double dp_comm = 0, dp_window = 0, optimizer = 0;
  double embedding_sync = 0;  // the tied embedding's all-reduce of the end stages
  double z3_per_mb = 0;       // ZeRO-3 gathers + reduce-scatter per microbatch (overlapped)
  double z3_fwd_per_mb = 0;   // of which forward's gather
  // Gathered module by module (Layout::z3_module_prefetch): one block's forward and backward
  // with their gathers and reduce-scatters (module_walk), and the collectives of the
  // parameters outside the blocks' matrices (embedding, head, norms, biases) per pass.
  bool z3_walk = false;
  double z3_layer_fwd = 0, z3_layer_bwd = 0, z3_rest_fwd = 0, z3_rest_bwd = 0;
  // Unfused gradient accumulation: seconds per parameter of a chunk, per backward (0 when
  // the weight-gradient GEMMs accumulate themselves); whether the first microbatch's
  // backward is free (torch DDP: autograd keeps the first gradient as .grad, no add).
  double accum_per_param_s = 0;
  bool accum_first_free = false;
  std::vector<double> chunk_psi;  // parameters per chunk, per TP rank
  // A shared host's collectives are copies by the same cores that compute: nothing overlaps.
  bool comm_uses_compute = false;
  int64_t microbatches = 0;
};

Prepared prepare(const Job& j, const Layout& l);
// The pipeline replay of the prepared layout (keep_spans: the per-rank timeline).
ReplayResult replay_layout(const Job& j, const Layout& l, const Prepared& p, bool keep_spans);
// A step time no replay of this layout beats (the search skips a layout whose bound is
// already slower than its k-th best).
double lower_bound(const Job& j, const Prepared& p, const Layout& l);
// The step time and its parts from the replay in e.replay.
void finish(const Job& j, const Prepared& p, Estimate& e);

}  // namespace mt::plan::step_model

// `train`'s up-front memory check: before anything is allocated, the run's peak per rank from
// the planner's memory model (plan::memory_by_stage: the allocator's peak to the byte for f32
// runs on the CPU, docs/planner.md "Against our runtime") is added up over the ranks that
// share this host (or one GPU, with --device cuda) and compared with what the host (GPU) has
// free. A run that cannot fit is refused (exit 2) with the estimate and the changes that would
// fit (a smaller --microbatch, --recompute, ZeRO, more tp or pp), each costed by the same
// model. Where the model only bounds the run from below (bf16: its weight copy and GEMM
// scratch come on top; a GPU's fused attention keeps no T x T probabilities, so only the
// model states are counted) the bound is what is compared: the check never refuses a run
// that fits. For Llama-family blocks the model is an estimate ("about": 8% under the
// allocator's peak for llama-tiny, measured 2026-11-27).
#pragma once

#include <string>

#include "train/trainer.h"

namespace mt::cli {

// Refuses `o` (already validated) when it cannot fit; returns without a word when it fits,
// when the planner does not model the layout, or when the host's memory cannot be read.
void check_memory_fits(const train::TrainOptions& o);

}  // namespace mt::cli

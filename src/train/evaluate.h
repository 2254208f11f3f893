// Where a rank's samples are in a global batch, and the validation loss: training and
// validation number their samples alike, so neither depends on the layout (DESIGN.md idea 2).
#pragma once

#include <cstdint>
#include <vector>

#include "comm/group.h"
#include "model/gpt.h"
#include "train/pipeline_stage.h"
#include "train/replica.h"
#include "train/token_corpus.h"

namespace mt::train {

// The global batch `step` is samples [step·B, step·B + B); dp rank d of D takes
// [step·B + d·B/D, step·B + (d+1)·B/D), in microbatches of mb. The same numbering serves
// validation (batch k of the held-out split), so neither depends on the layout.
inline int64_t first_sample(int64_t step, int64_t B, int d, int D, int64_t m, int64_t mb) {
  return step * B + d * (B / D) + m * mb;
}

// Mean loss over the first `batches` global batches of the held-out split; each rank
// evaluates its share (the same samples as training's sharding picks). Counted on one rank
// of each tp group, on the last pipeline stage.
float evaluate(Replica& r, int d, int D, model::Activations* acts, PipelineStage* stage,
               comm::Group& ppg, const SequenceSampler& val, int64_t batches, int64_t B,
               int64_t n_micro, int64_t mb, comm::Group* scalars, std::vector<int32_t>& in,
               std::vector<int32_t>& tgt);

}  // namespace mt::train

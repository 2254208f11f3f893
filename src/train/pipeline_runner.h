// Pipeline-parallel training (docs/pipeline.md): `meshtrain train --pp P --microbatches m
// --schedule {gpipe,1f1b,interleaved,zb1}` on a pp x dp mesh (pp slowest). Each rank builds
// only its chunks' layers, the executor (parallel/pipeline/executor.h) walks its verified
// action list, gradients are reduced over dp after the step, and the tied embedding / LM head
// gradients are summed between the first and the last stage.
#pragma once

#include "train/trainer.h"

namespace mt::train {

TrainResult run_pipeline_training(const TrainOptions& o);

}  // namespace mt::train

// `train --init-from WEIGHTS`: a run that starts from Hugging Face weights (a fine-tuning
// run) in any layout. Every rank fills its own optimizer range (its tp slice, its ZeRO shard)
// from the file, so the weights are sharded on load; Adam starts fresh.
#pragma once

#include <memory>

#include "train/hf_export.h"
#include "train/trainer.h"

namespace mt::train {

class Replica;

// Reads the weights (a file, or an export folder with its config.json) and checks that they
// are the model the run builds (its sequence length may differ with rotary positions),
// refusing otherwise with both descriptions.
std::unique_ptr<const HfWeights> read_init_weights(const TrainOptions& o);

// The model the weights hold (for `train --init-from` without --model).
model::GptConfig init_weights_config(const std::string& path, std::optional<int64_t> n_head);

// Overwrites the rank's master values with the weights (every rank calls it).
void init_from_weights(Replica& rep, const HfWeights& w, const model::GptConfig& c);

}  // namespace mt::train

// Weights in Hugging Face GPT-2 names and layout, as one safetensors file: Conv1D weights
// [in, out] (ours are [out, in]), the vocabulary padding stripped, the shape in metadata.
#pragma once

#include <optional>
#include <string>

#include "model/gpt.h"
#include "train/safetensors.h"

namespace mt::train {

void export_hf_safetensors(const model::Gpt& gpt, const std::string& path);

// The model shape a file holds: metadata where present, else inferred from the tensor
// shapes; n_head must come from metadata or `n_head_hint` (it is not in the shapes). A hint
// that disagrees with the n_head the file records is refused.
model::GptConfig config_from_hf(const SafetensorsFile& f, const std::string& path,
                                std::optional<int64_t> n_head_hint);

// Copies the file's tensors into the model, refusing a missing tensor or a shape mismatch.
void load_hf_weights(model::Gpt& gpt, const SafetensorsFile& f, const std::string& path);

}  // namespace mt::train

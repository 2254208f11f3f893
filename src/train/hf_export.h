// Weights in Hugging Face names and layout, as one safetensors file: GPT-2's
// (GPT2LMHeadModel: Conv1D weights [in, out], ours are [out, in]) or Llama's
// (LlamaForCausalLM: our fused q|k|v and gate|up split into q_proj, k_proj, v_proj and
// gate_proj, up_proj), the vocabulary padding stripped, the shape in metadata. An export path
// that does not end in .safetensors and is not an existing file is a folder:
// model.safetensors and a config.json that Hugging Face reads go into it (a file path gets
// the weights alone, so that no config.json beside it is overwritten).
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>

#include "model/gpt.h"
#include "train/safetensors.h"

namespace mt::train {

void export_hf_safetensors(const model::Gpt& gpt, const std::string& path);
// The weights file of an export path (`path`, or path/model.safetensors for a folder).
std::string export_weights_file(const std::string& path);
// Hugging Face's config.json of a model (GPT2Config or LlamaConfig fields).
std::string hf_config_json(const model::GptConfig& c);
// Its rope_scaling field: Llama 3's frequency scaling as transformers names it, null without.
// A checkpoint's model description writes the same object.
nlohmann::json hf_rope_scaling(const model::RopeScaling& r);

// Reads weights given as a file or as an export folder: a folder's config.json gives the
// model (required for Llama weights, whose heads are not in the shapes).
struct HfWeights {
  SafetensorsFile file;
  std::string path;         // the safetensors file
  std::string config_path;  // config.json, or "" when there is none
};
HfWeights read_hf_weights(const std::string& file_or_folder);
model::GptConfig config_from_hf(const HfWeights& w, std::optional<int64_t> n_head_hint);
// The same for a file read alone (no config.json).
inline model::GptConfig config_from_hf(const SafetensorsFile& f, const std::string& path,
                                       std::optional<int64_t> n_head_hint) {
  return config_from_hf(HfWeights{f, path, ""}, n_head_hint);
}

// The model the weights hold. GPT-2 names: inferred from the tensor shapes, n_head from
// metadata or `n_head_hint` (it is not in the shapes; a hint that disagrees with the
// recorded n_head is refused). Llama names: the config.json, required and checked.

// One parameter, whole (its global shape, our layout, vocabulary padding rows 0), from the
// file's tensors: refuses a missing tensor or a shape mismatch. `spec` may be a tp shard's.
std::vector<float> hf_global_tensor(const SafetensorsFile& f, const std::string& path,
                                    const model::ParamSpec& spec, const model::GptConfig& c);

// Copies the file's tensors into the model, refusing a missing tensor or a shape mismatch.
void load_hf_weights(model::Gpt& gpt, const SafetensorsFile& f, const std::string& path);

}  // namespace mt::train

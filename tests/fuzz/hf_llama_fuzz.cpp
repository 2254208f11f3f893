// A Hugging Face Llama folder (config.json + model.safetensors in LlamaForCausalLM names) as
// `meshtrain eval --weights DIR` and `train --init-from DIR` read it (cli/eval.cpp,
// train/init_from.h): the folder read (train/hf_export.h read_hf_weights), the model taken
// from config.json and checked against the file's tensors (config_from_hf), the model built
// and its weights loaded (load_hf_weights, eval's), and every parameter taken whole as
// --init-from fills a rank's shard (hf_global_tensor).
//
// The input is both files: the config.json's length (uint32, little-endian; clamped to what
// follows; 0: the folder has no config.json), the config.json, then model.safetensors (the
// rest).
#include <cstring>
#include <filesystem>

#include "fuzz.h"
#include "model/gpt.h"
#include "model/params.h"
#include "train/hf_export.h"

using namespace mt;

MT_FUZZ_TARGET(hf_llama) {
  if (bytes.size() < 4) return;
  uint32_t config_bytes = 0;
  std::memcpy(&config_bytes, bytes.data(), 4);
  const std::string_view rest = bytes.substr(4);
  const std::string_view config = rest.substr(0, config_bytes),
                         weights = rest.substr(config.size());

  const std::filesystem::path dir = fuzz::scratch_dir() / "llama";
  std::filesystem::create_directories(dir);
  std::filesystem::remove(dir / "config.json");
  if (!config.empty()) fuzz::write_file((dir / "config.json").string(), config);
  fuzz::write_file((dir / "model.safetensors").string(), weights);

  // A refusal names config.json or model.safetensors: both are in the folder.
  fuzz::read_or_refuse(dir.string(), [&] {
    // eval --weights DIR (no --n-head)
    const train::HfWeights w = train::read_hf_weights(dir.string());
    const model::GptConfig c = train::config_from_hf(w, std::nullopt);
    c.validate();
    model::Gpt gpt(c, 0);
    train::load_hf_weights(gpt, w.file, w.path);
    // train --init-from DIR: each parameter whole, in our layout, from the file's tensors.
    for (const model::ParamSpec& s : model::gpt_param_specs(c))
      (void)train::hf_global_tensor(w.file, w.path, s, c);
  });
}

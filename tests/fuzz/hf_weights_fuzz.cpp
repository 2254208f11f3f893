// `meshtrain eval --weights FILE.safetensors` (cli/eval.cpp): a Hugging Face GPT-2 file read
// (train/safetensors.h), its model shape taken from the tensors and metadata
// (train/hf_export.h config_from_hf), the model built and its weights loaded.
#include "fuzz.h"
#include "model/gpt.h"
#include "train/hf_export.h"
#include "train/safetensors.h"

using namespace mt;

MT_FUZZ_TARGET(hf_weights) {
  const std::string path = fuzz::write_input("model.safetensors", bytes);
  fuzz::read_or_refuse(path, [&] {
    const train::SafetensorsFile f = train::read_safetensors(path);
    // eval's --n-head: given only where the file does not record it.
    const std::optional<int64_t> hint =
        f.metadata.count("n_head") ? std::nullopt : std::optional<int64_t>(1);
    const model::GptConfig c = train::config_from_hf(f, path, hint);
    model::Gpt gpt(c, 0);
    train::load_hf_weights(gpt, f, path);
  });
}

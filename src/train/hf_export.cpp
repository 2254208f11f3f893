#include "train/hf_export.h"

#include <regex>

#include "core/error.h"

namespace mt::train {

namespace {
// Rows kept in the file: the real vocabulary for embedding-like tensors.
int64_t file_rows(const model::ParamSpec& s) { return s.real_rows >= 0 ? s.real_rows : s.shape[0]; }

Shape hf_shape(const model::ParamSpec& s) {
  if (s.shape.size() == 1) return s.shape;
  if (s.hf_transposed) return {s.shape[1], s.shape[0]};
  return {file_rows(s), s.shape[1]};
}
// n_head from the file's metadata; the hint (--n-head) only where the file does not record
// it. A hint that disagrees is refused: the same weights with other heads give another loss.
int64_t n_head_of(const SafetensorsFile& f, const std::string& path, std::optional<int64_t> hint) {
  auto meta = f.metadata.find("n_head");
  if (meta == f.metadata.end()) {
    if (!hint)
      fail(
          "weights file '{}' does not record n_head (it cannot be read off the shapes): pass "
          "--n-head",
          path);
    return *hint;
  }
  const int64_t recorded = std::stoll(meta->second);
  if (hint && *hint != recorded)
    fail(
        "--n-head {} disagrees with n_head {} recorded in weights file '{}' (drop --n-head: it "
        "is only for files that do not record n_head)",
        *hint, recorded, path);
  return recorded;
}
}  // namespace

void export_hf_safetensors(const model::Gpt& gpt, const std::string& path) {
  std::vector<NamedArray> arrays;
  for (const auto& p : gpt.params().params()) {
    NamedArray a;
    a.name = p.spec.name;
    a.shape = hf_shape(p.spec);
    const float* src = p.value.f32();
    a.data.resize(static_cast<size_t>(shape_numel(a.shape)));
    if (p.spec.hf_transposed) {
      const int64_t out = p.spec.shape[0], in = p.spec.shape[1];
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i) a.data[i * out + o] = src[o * in + i];
    } else {
      std::copy(src, src + a.data.size(), a.data.begin());
    }
    arrays.push_back(std::move(a));
  }
  const auto& c = gpt.config();
  std::map<std::string, std::string> meta = {
      {"format", "pt"},
      {"producer", "meshtrain"},
      {"n_layer", std::to_string(c.n_layer)},
      {"n_head", std::to_string(c.n_head)},
      {"d_model", std::to_string(c.d_model)},
      {"d_ff", std::to_string(c.d_ff)},
      {"vocab", std::to_string(c.vocab)},
      {"seq_len", std::to_string(c.seq_len)},
      {"bias", c.bias ? "true" : "false"},
      {"tied", c.tied ? "true" : "false"},
      {"vocab_padding",
       "stripped: meshtrain pads the vocabulary to a multiple of 128 "
       "internally; this file holds the real rows only"}};
  write_safetensors(path, arrays, meta);
}

model::GptConfig config_from_hf(const SafetensorsFile& f, const std::string& path,
                                std::optional<int64_t> n_head_hint) {
  auto need = [&](const std::string& name) -> const NamedArray& {
    auto it = f.arrays.find(name);
    if (it == f.arrays.end())
      fail("weights file '{}' has no tensor '{}': not a GPT-2 checkpoint in Hugging Face names",
           path, name);
    return it->second;
  };
  model::GptConfig c;
  c.name = "from " + path;
  const auto& wte = need("transformer.wte.weight");
  const auto& wpe = need("transformer.wpe.weight");
  c.vocab = wte.shape.at(0);
  c.d_model = wte.shape.at(1);
  c.seq_len = wpe.shape.at(0);
  int64_t layers = 0;
  std::regex layer_re(R"(transformer\.h\.(\d+)\.)");
  for (const auto& [name, a] : f.arrays) {
    std::smatch m;
    if (std::regex_search(name, m, layer_re))
      layers = std::max<int64_t>(layers, std::stoll(m[1]) + 1);
  }
  c.n_layer = layers;
  c.d_ff = layers ? need("transformer.h.0.mlp.c_fc.weight").shape.at(1) : 4 * c.d_model;
  c.bias = f.arrays.count("transformer.ln_f.bias") > 0;
  c.tied = f.arrays.count("lm_head.weight") == 0;
  c.n_head = n_head_of(f, path, n_head_hint);
  return c;
}

void load_hf_weights(model::Gpt& gpt, const SafetensorsFile& f, const std::string& path) {
  for (auto& p : gpt.params().params()) {
    auto it = f.arrays.find(p.spec.name);
    if (it == f.arrays.end())
      fail("weights file '{}' has no tensor '{}' that this model needs", path, p.spec.name);
    const NamedArray& a = it->second;
    const Shape want = hf_shape(p.spec);
    if (a.shape != want)
      fail(
          "weights file '{}': tensor '{}' has shape {} but the model needs {} (do the model "
          "flags match the file?)",
          path, p.spec.name, shape_str(a.shape), shape_str(want));
    float* dst = p.value.f32();
    if (p.spec.hf_transposed) {
      const int64_t out = p.spec.shape[0], in = p.spec.shape[1];
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i) dst[o * in + i] = a.data[i * out + o];
    } else {
      p.value.zero_();  // padding rows stay zero
      std::copy(a.data.begin(), a.data.end(), dst);
    }
  }
}

}  // namespace mt::train

#include "train/hf_export.h"

#include <charconv>
#include <regex>
#include <set>

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
  int64_t recorded = 0;
  const std::string& text = meta->second;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), recorded);
  if (ec != std::errc() || end != text.data() + text.size() || recorded < 1)
    fail("weights file '{}' records n_head '{}' in its metadata: not a positive integer", path,
         text);
  if (hint && *hint != recorded)
    fail(
        "--n-head {} disagrees with n_head {} recorded in weights file '{}' (drop --n-head: it "
        "is only for files that do not record n_head)",
        *hint, recorded, path);
  return recorded;
}

// The file's tensor of `spec`, in the file's layout; refuses a missing one or another shape.
const NamedArray& check_tensor(const SafetensorsFile& f, const std::string& path,
                               const model::ParamSpec& spec) {
  auto it = f.arrays.find(spec.name);
  if (it == f.arrays.end())
    fail("weights file '{}' has no tensor '{}' that this model needs", path, spec.name);
  const Shape want = hf_shape(spec);
  if (it->second.shape != want)
    fail(
        "weights file '{}': tensor '{}' has shape {} but the model needs {} (do the model "
        "flags match the file?)",
        path, spec.name, shape_str(it->second.shape), shape_str(want));
  return it->second;
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
  auto need = [&](const std::string& name, size_t rank) -> const NamedArray& {
    auto it = f.arrays.find(name);
    if (it == f.arrays.end())
      fail("weights file '{}' has no tensor '{}': not a GPT-2 checkpoint in Hugging Face names",
           path, name);
    if (it->second.shape.size() != rank)
      fail("weights file '{}': tensor '{}' has shape {}; GPT-2's has {} dimensions", path, name,
           shape_str(it->second.shape), rank);
    return it->second;
  };
  model::GptConfig c;
  c.name = "from " + path;
  const auto& wte = need("transformer.wte.weight", 2);
  const auto& wpe = need("transformer.wpe.weight", 2);
  c.vocab = wte.shape[0];
  c.d_model = wte.shape[1];
  c.seq_len = wpe.shape[0];
  // The blocks: transformer.h.0 .. transformer.h.{n_layer - 1}, each present (a file cannot
  // claim more blocks than it holds tensors).
  std::set<int64_t> layers;
  const std::regex layer_re(R"(transformer\.h\.(\d+)\.)");
  for (const auto& [name, a] : f.arrays) {
    std::smatch m;
    if (!std::regex_search(name, m, layer_re)) continue;
    int64_t l = -1;
    const std::string digits = m[1];
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), l);
    if (ec != std::errc() || l >= static_cast<int64_t>(f.arrays.size()))
      fail("weights file '{}': tensor '{}' names block {}, but the file holds {} tensors", path,
           name, digits, f.arrays.size());
    layers.insert(l);
  }
  c.n_layer = static_cast<int64_t>(layers.size());
  if (!layers.empty() && *layers.rbegin() != c.n_layer - 1)
    fail("weights file '{}' has tensors of block {} but not of all the blocks before it", path,
         *layers.rbegin());
  c.d_ff = c.n_layer ? need("transformer.h.0.mlp.c_fc.weight", 2).shape[1] : 4 * c.d_model;
  c.bias = f.arrays.count("transformer.ln_f.bias") > 0;
  c.tied = f.arrays.count("lm_head.weight") == 0;
  c.n_head = n_head_of(f, path, n_head_hint);
  try {
    c.validate();
  } catch (const Error& e) {
    fail("weights file '{}' describes no valid GPT model: {}", path, e.what());
  }
  // Every tensor of that model is in the file with its shape: building the model then
  // allocates what the file holds (and the vocabulary padding), not what it claims.
  for (const model::ParamSpec& s : model::gpt_param_specs(c)) check_tensor(f, path, s);
  return c;
}

void load_hf_weights(model::Gpt& gpt, const SafetensorsFile& f, const std::string& path) {
  for (auto& p : gpt.params().params()) {
    const NamedArray& a = check_tensor(f, path, p.spec);
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

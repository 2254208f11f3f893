#include "train/hf_export.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/json.h"
#include "core/write_file.h"
#include "train/json_read.h"
#include "train/nonfinite.h"
#include "train/safetensors_shards.h"

namespace mt::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
// Rows kept in the file: the real vocabulary for embedding-like tensors.
int64_t file_rows(const model::ParamSpec& s) { return s.real_rows >= 0 ? s.real_rows : s.shape[0]; }

// Where one of our tensors lives in Hugging Face's names: one tensor, or (Llama's fused
// q|k|v and gate|up) several, each a range of our rows.
struct HfPart {
  std::string name;
  int64_t row0 = 0, rows = 0;
};

std::vector<HfPart> hf_parts(const model::ParamSpec& s, const model::GptConfig& c) {
  const int64_t rows = file_rows(s);
  if (!c.llama_family()) return {{s.name, 0, rows}};
  static const std::regex layer_re(R"(transformer\.h\.(\d+)\.(.*))");
  std::smatch m;
  if (s.name == "transformer.wte.weight") return {{"model.embed_tokens.weight", 0, rows}};
  if (s.name == "lm_head.weight") return {{"lm_head.weight", 0, rows}};
  if (s.name == "transformer.ln_f.weight") return {{"model.norm.weight", 0, rows}};
  if (!std::regex_match(s.name, m, layer_re)) fail("no Hugging Face Llama name for '{}'", s.name);
  const std::string h = "model.layers." + m[1].str() + ".", rest = m[2].str();
  const int64_t C = c.d_model, kv = c.kv_dim(), F = c.d_ff;
  if (rest == "ln_1.weight") return {{h + "input_layernorm.weight", 0, rows}};
  if (rest == "ln_2.weight") return {{h + "post_attention_layernorm.weight", 0, rows}};
  if (rest == "attn.c_proj.weight") return {{h + "self_attn.o_proj.weight", 0, rows}};
  if (rest == "mlp.c_proj.weight") return {{h + "mlp.down_proj.weight", 0, rows}};
  // Mixtral's names for an MoE block: the router is block_sparse_moe.gate, expert j's gate,
  // down and up projections w1, w2, w3. Our stacked [E, 2F, C] and [E, C, F] tensors count
  // rows of their [E·2F, C] and [E·C, F] views.
  const std::string moe = h + "block_sparse_moe.";
  if (rest == "moe.router.weight") return {{moe + "gate.weight", 0, rows}};
  if (rest == "moe.experts.c_fc.weight" || rest == "moe.experts.c_proj.weight") {
    const bool in = rest == "moe.experts.c_fc.weight";
    const int64_t Fe = c.expert_ff();
    std::vector<HfPart> parts;
    for (int64_t j = 0; j < c.moe.n_experts; ++j) {
      const std::string e = moe + "experts." + std::to_string(j) + ".";
      if (in) {
        parts.push_back({e + "w1.weight", j * 2 * Fe, Fe});
        parts.push_back({e + "w3.weight", j * 2 * Fe + Fe, Fe});
      } else {
        parts.push_back({e + "w2.weight", j * C, C});
      }
    }
    return parts;
  }
  // A shared expert (not in Mixtral: Qwen2-MoE's names under block_sparse_moe).
  if (rest == "moe.shared.c_fc.weight")
    return {{moe + "shared_expert.gate_proj.weight", 0, c.moe.d_ff_shared},
            {moe + "shared_expert.up_proj.weight", c.moe.d_ff_shared, c.moe.d_ff_shared}};
  if (rest == "moe.shared.c_proj.weight")
    return {{moe + "shared_expert.down_proj.weight", 0, rows}};
  // With biases (config.json's attention_bias and mlp_bias, both from our one switch).
  if (rest == "attn.c_proj.bias") return {{h + "self_attn.o_proj.bias", 0, rows}};
  if (rest == "mlp.c_proj.bias") return {{h + "mlp.down_proj.bias", 0, rows}};
  for (const char* kind : {"weight", "bias"}) {
    const std::string k = kind;
    if (rest == "attn.c_attn." + k)
      return {{h + "self_attn.q_proj." + k, 0, C},
              {h + "self_attn.k_proj." + k, C, kv},
              {h + "self_attn.v_proj." + k, C + kv, kv}};
    if (rest == "mlp.c_fc." + k)
      return {{h + "mlp.gate_proj." + k, 0, F}, {h + "mlp.up_proj." + k, F, F}};
  }
  fail("no Hugging Face Llama name for '{}'", s.name);
}

Shape part_shape(const model::ParamSpec& s, const HfPart& p) {
  if (s.shape.size() == 1) return {p.rows};
  if (s.shape.size() == 3) {  // stacked experts: rows of the [E·R, K] view, or all of it
    if (p.name.find("block_sparse_moe") == std::string::npos) return s.shape;
    return {p.rows, s.shape[2]};
  }
  if (s.hf_transposed) return {s.shape[1], p.rows};  // GPT-2's Conv1D: whole tensors only
  return {p.rows, s.shape[1]};
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

// A folder export: a path without the .safetensors suffix that is not an existing file (an
// existing file, /dev/null included, is written in place as before).
bool is_folder_path(const std::string& path) {
  if (path.size() >= 12 && path.compare(path.size() - 12, 12, ".safetensors") == 0) return false;
  std::error_code ec;
  return !fs::exists(path, ec) || fs::is_directory(path, ec);
}

// A config.json field, refused by name when missing or of another type (files from
// elsewhere are untrusted).
template <class T>
T field(const json& j, const char* key, const std::string& path) {
  if (!j.contains(key)) fail("config '{}' has no \"{}\"", path, key);
  const json& v = j.at(key);
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) fail("config '{}': \"{}\" must be true or false", path, key);
  } else if constexpr (std::is_integral_v<T>) {
    if (!v.is_number_integer()) fail("config '{}': \"{}\" must be an integer", path, key);
    return json_integer(v, "config '" + path + "'", key);  // 2^64 - 1 is not -1
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number()) fail("config '{}': \"{}\" must be a number", path, key);
  } else {
    if (!v.is_string()) fail("config '{}': \"{}\" must be a string", path, key);
  }
  return v.get<T>();
}

// The parameters of a Llama-family model as its file holds them (the real vocabulary rows;
// model/params.cpp gpt_param_specs), in double: a config's dimensions may multiply past
// int64.
double llama_parameter_count(const model::GptConfig& c) {
  const double d = static_cast<double>(c.d_model), f = static_cast<double>(c.d_ff);
  const double kv = static_cast<double>(c.kv_heads()) * static_cast<double>(c.head_dim());
  // Per block: 2 norms, q|k|v, o, then gate|up|down (dense) or the router, the experts'
  // and the shared expert's (MoE).
  // MoE blocks in closed form (a file may claim 2^31 layers): i + 1 a multiple of `every`
  // in (first_dense, n_layer].
  const double moe_blocks =
      c.moe.enabled() ? static_cast<double>(c.n_layer / c.moe.every -
                                            std::min(c.moe.first_dense, c.n_layer) / c.moe.every)
                      : 0.0;
  const double dense_blocks = static_cast<double>(c.n_layer) - moe_blocks;
  double attention = 2 * d + d * (d + 2 * kv) + d * d;
  if (c.bias) attention += (d + 2 * kv) + d;
  const double mlp = 3 * d * f + (c.bias ? 2 * f + d : 0);
  const double moe =
      static_cast<double>(c.moe.n_experts) * (d + 3 * d * static_cast<double>(c.expert_ff())) +
      3 * d * static_cast<double>(c.moe.d_ff_shared);
  const double blocks =
      static_cast<double>(c.n_layer) * attention + dense_blocks * mlp + moe_blocks * moe;
  const double embedding = static_cast<double>(c.vocab) * d;
  return embedding * (c.tied ? 1 : 2) + d + blocks;
}

// A dimension of a config.json: at most 2^31 (what a product of two may reach fits int64).
constexpr int64_t kMaxDimension = int64_t{1} << 31;

model::GptConfig llama_config_from_json(const json& j, const std::string& path) {
  model::GptConfig c;
  c.name = "from " + path;
  c.n_layer = field<int64_t>(j, "num_hidden_layers", path);
  c.n_head = field<int64_t>(j, "num_attention_heads", path);
  c.n_kv_head =
      j.contains("num_key_value_heads") ? field<int64_t>(j, "num_key_value_heads", path) : c.n_head;
  c.d_model = field<int64_t>(j, "hidden_size", path);
  c.d_ff = field<int64_t>(j, "intermediate_size", path);
  c.vocab = field<int64_t>(j, "vocab_size", path);
  c.seq_len = field<int64_t>(j, "max_position_embeddings", path);
  // Shapes a file could make absurd are refused before any tensor is sized from them (or
  // any product of two of them taken).
  for (const int64_t v : {c.n_layer, c.n_head, c.n_kv_head, c.d_model, c.d_ff, c.vocab, c.seq_len})
    if (v < 1 || v > kMaxDimension)
      fail("config '{}': a dimension of {} is outside [1, 2^31]", path, v);
  c.norm = model::NormKind::kRmsNorm;
  // A double past float's range converted to float is undefined behaviour: refused first.
  const double eps = field<double>(j, "rms_norm_eps", path);
  if (!(eps > 0 && eps <= std::numeric_limits<float>::max()))
    fail("config '{}': rms_norm_eps {} must be a positive float (Llama 3: 1e-5)", path, eps);
  c.norm_eps = static_cast<float>(eps);
  c.mlp = model::MlpKind::kSwiGlu;
  c.positions = model::Positions::kRope;
  c.rope_theta = j.contains("rope_theta") ? field<double>(j, "rope_theta", path) : 10000.0;
  if (j.contains("num_local_experts") && !j.at("num_local_experts").is_null()) {  // Mixtral
    c.moe.n_experts = field<int64_t>(j, "num_local_experts", path);
    c.moe.top_k = field<int64_t>(j, "num_experts_per_tok", path);
    if (c.moe.n_experts < 1 || c.moe.n_experts > 65536 || c.moe.top_k < 1 ||
        c.moe.top_k > c.moe.n_experts)
      fail(
          "config '{}': num_local_experts {} must be in [1, 65536] and num_experts_per_tok {} "
          "in [1, num_local_experts]",
          path, c.moe.n_experts, c.moe.top_k);
    if (j.contains("meshtrain_moe_every")) {
      c.moe.every = field<int64_t>(j, "meshtrain_moe_every", path);
      c.moe.first_dense = field<int64_t>(j, "meshtrain_moe_first_dense", path);
      c.d_ff = field<int64_t>(j, "meshtrain_dense_intermediate_size", path);
      c.moe.d_ff_expert = field<int64_t>(j, "intermediate_size", path);
    }
    if (j.contains("meshtrain_shared_expert_intermediate_size"))
      c.moe.d_ff_shared = field<int64_t>(j, "meshtrain_shared_expert_intermediate_size", path);
    for (const int64_t v :
         {c.moe.every, c.moe.first_dense + 1, c.d_ff, c.moe.d_ff_expert + 1, c.moe.d_ff_shared + 1})
      if (v < 1 || v > kMaxDimension)
        fail("config '{}': an MoE field of {} is outside its range", path, v);
  }
  c.tied = j.contains("tie_word_embeddings") && field<bool>(j, "tie_word_embeddings", path);
  c.bias = j.contains("attention_bias") && field<bool>(j, "attention_bias", path);
  if (j.contains("hidden_act") && field<std::string>(j, "hidden_act", path) != "silu")
    fail("config '{}': hidden_act '{}' (meshtrain's Llama MLP is SwiGLU: silu)", path,
         j.at("hidden_act").get<std::string>());
  if (j.contains("head_dim") && !j.at("head_dim").is_null()) {
    const int64_t head_dim = field<int64_t>(j, "head_dim", path);
    // Both in [1, 2^31]: the product fits int64.
    if (head_dim < 1 || head_dim > kMaxDimension || head_dim * c.n_head != c.d_model)
      fail("config '{}': head_dim {} x num_attention_heads {} must equal hidden_size {}", path,
           head_dim, c.n_head, c.d_model);
  }
  if (j.contains("rope_scaling") && !j.at("rope_scaling").is_null()) {
    const json& r = j.at("rope_scaling");
    if (!r.is_object()) fail("config '{}': rope_scaling must be an object or null", path);
    const std::string type = r.contains("rope_type") ? field<std::string>(r, "rope_type", path)
                                                     : field<std::string>(r, "type", path);
    if (type != "llama3")
      fail("config '{}': rope_scaling type '{}' is not supported (llama3 is)", path, type);
    c.rope_scaling.llama3 = true;
    c.rope_scaling.factor = field<double>(r, "factor", path);
    c.rope_scaling.low_freq_factor = field<double>(r, "low_freq_factor", path);
    c.rope_scaling.high_freq_factor = field<double>(r, "high_freq_factor", path);
    c.rope_scaling.original_max_position =
        field<int64_t>(r, "original_max_position_embeddings", path);
  }
  return c;
}

// The claims of a config.json checked against its weights file before anything is sized
// from them (files from elsewhere, docs/fuzzing.md): the model's parameters must be values
// the file holds, and the rotary tables built for every position (model/rope.h: cos and sin,
// [max_position_embeddings, head_dim / 2] f32 each) may be at most the model's weights in
// f32, or 64 MiB. Before: 10^6 layers in the config were allocated (their parameter specs)
// before the file was found to lack them, and max_position_embeddings 2^31 built 16 GiB of
// tables.
void check_config_against_file(const model::GptConfig& c, const SafetensorsFile& f,
                               const std::string& path, const std::string& config_path) {
  const double params = llama_parameter_count(c);
  double held = 0;
  for (const auto& [name, a] : f.arrays) held += static_cast<double>(a.data.size());
  if (params > held)
    fail(
        "config '{}' describes a model of {:.6g} parameters (num_hidden_layers {}, hidden_size {}, "
        "intermediate_size {}, vocab_size {}), but weights file '{}' holds {:.0f} values: the "
        "config is not this file's, or either is damaged",
        config_path, params, c.n_layer, c.d_model, c.d_ff, c.vocab, path, held);
  constexpr double kMiB = 1024.0 * 1024.0, kRopeFloorBytes = 64 * kMiB;
  const double rope_bytes =
      4.0 * static_cast<double>(c.seq_len) * static_cast<double>(c.d_model / c.n_head);
  if (rope_bytes > std::max(4.0 * params, kRopeFloorBytes))
    fail(
        "config '{}': max_position_embeddings {} makes rotary tables (cos and sin of every "
        "position, head_dim {}) of {:.4g} MiB, more than the model's weights ({:.4g} MiB in "
        "f32) and the 64 MiB allowed beside them: a damaged config? (give the context length "
        "the model was trained for)",
        config_path, c.seq_len, c.d_model / c.n_head, rope_bytes / kMiB, 4.0 * params / kMiB);
}

// The file's tensors of `spec` (one, or the parts of a fused one), each present with the
// shape the model needs; refuses otherwise, naming the tensor.
void check_tensor(const SafetensorsFile& f, const std::string& path, const model::ParamSpec& spec,
                  const model::GptConfig& c) {
  for (const HfPart& part : hf_parts(spec, c)) {
    auto it = f.arrays.find(part.name);
    if (it == f.arrays.end())
      fail("weights file '{}' has no tensor '{}' that this model needs", path, part.name);
    const Shape want = part_shape(spec, part);
    if (it->second.shape != want)
      fail(
          "weights file '{}': tensor '{}' has shape {} but the model needs {} (do the model "
          "flags match the file?)",
          path, part.name, shape_str(it->second.shape), shape_str(want));
  }
}
}  // namespace

std::string export_weights_file(const std::string& path) {
  return is_folder_path(path) ? (fs::path(path) / "model.safetensors").string() : path;
}

nlohmann::json hf_rope_scaling(const model::RopeScaling& r) {
  if (!r.llama3) return nullptr;
  return {{"rope_type", "llama3"},
          {"factor", r.factor},
          {"low_freq_factor", r.low_freq_factor},
          {"high_freq_factor", r.high_freq_factor},
          {"original_max_position_embeddings", r.original_max_position}};
}

std::string hf_config_json(const model::GptConfig& c) {
  json j;
  if (c.llama_family()) {
    j = {{"architectures", {"LlamaForCausalLM"}},
         {"model_type", "llama"},
         {"hidden_size", c.d_model},
         {"intermediate_size", c.d_ff},
         {"num_hidden_layers", c.n_layer},
         {"num_attention_heads", c.n_head},
         {"num_key_value_heads", c.kv_heads()},
         {"head_dim", c.head_dim()},
         {"vocab_size", c.vocab},
         {"max_position_embeddings", c.seq_len},
         {"rms_norm_eps", c.norm_eps},
         {"rope_theta", c.rope_theta},
         {"tie_word_embeddings", c.tied},
         {"hidden_act", "silu"},
         {"attention_bias", c.bias},
         {"mlp_bias", c.bias},
         {"torch_dtype", "float32"}};
    if (c.moe.enabled()) {  // Mixtral's fields (every block MoE, the experts' width)
      j["architectures"] = {"MixtralForCausalLM"};
      j["model_type"] = "mixtral";
      j["intermediate_size"] = c.expert_ff();
      j["num_local_experts"] = c.moe.n_experts;
      j["num_experts_per_tok"] = c.moe.top_k;
      j["output_router_logits"] = false;
      j["sliding_window"] = nullptr;
      // What Mixtral cannot say, in fields of our own (transformers does not read them).
      if (c.moe.every != 1 || c.moe.first_dense != 0) {
        j["meshtrain_moe_every"] = c.moe.every;
        j["meshtrain_moe_first_dense"] = c.moe.first_dense;
        j["meshtrain_dense_intermediate_size"] = c.d_ff;
      }
      if (c.moe.d_ff_shared > 0) j["meshtrain_shared_expert_intermediate_size"] = c.moe.d_ff_shared;
    }
    j["rope_scaling"] = hf_rope_scaling(c.rope_scaling);
  } else {
    j = {{"architectures", {"GPT2LMHeadModel"}},
         {"model_type", "gpt2"},
         {"n_embd", c.d_model},
         {"n_inner", c.d_ff},
         {"n_layer", c.n_layer},
         {"n_head", c.n_head},
         {"vocab_size", c.vocab},
         {"n_positions", c.seq_len},
         {"layer_norm_epsilon", 1e-5},
         {"activation_function", "gelu_new"},
         {"tie_word_embeddings", c.tied},
         {"torch_dtype", "float32"}};
  }
  return j.dump(2) + "\n";
}

void export_hf_safetensors(const model::Gpt& gpt, const std::string& path) {
  const auto& c = gpt.config();
  std::vector<NamedArray> arrays;
  for (const auto& p : gpt.params().params()) {
    const int64_t cols = p.spec.shape.size() > 1 ? p.spec.shape.back() : 1;
    for (const HfPart& part : hf_parts(p.spec, c)) {
      NamedArray a;
      a.name = part.name;
      a.shape = part_shape(p.spec, part);
      const float* src = p.value.f32() + part.row0 * cols;
      a.data.resize(static_cast<size_t>(shape_numel(a.shape)));
      if (p.spec.hf_transposed) {
        const int64_t out = part.rows, in = cols;
        for (int64_t o = 0; o < out; ++o)
          for (int64_t i = 0; i < in; ++i) a.data[i * out + o] = src[o * in + i];
      } else {
        std::copy(src, src + a.data.size(), a.data.begin());
      }
      arrays.push_back(std::move(a));
    }
  }
  std::map<std::string, std::string> meta = {
      {"format", "pt"},
      {"producer", "meshtrain"},
      {"architecture", c.llama_family() ? "llama" : "gpt2"},
      {"n_layer", std::to_string(c.n_layer)},
      {"n_head", std::to_string(c.n_head)},
      {"n_kv_head", std::to_string(c.kv_heads())},
      {"d_model", std::to_string(c.d_model)},
      {"d_ff", std::to_string(c.d_ff)},
      {"vocab", std::to_string(c.vocab)},
      {"seq_len", std::to_string(c.seq_len)},
      {"bias", c.bias ? "true" : "false"},
      {"tied", c.tied ? "true" : "false"},
      {"vocab_padding",
       "stripped: meshtrain pads the vocabulary to a multiple of 128 "
       "internally; this file holds the real rows only"}};
  // Nothing non-finite is exported (train/nonfinite.h): checked before anything is written.
  for (const NamedArray& a : arrays) {
    const std::string bad =
        describe_nonfinite("'" + a.name + "'", a.data.data(), static_cast<int64_t>(a.data.size()));
    if (!bad.empty())
      fail_run("not exporting to '{}': {}; the weights are damaged (nothing was written)", path,
               bad);
  }
  const std::string file = export_weights_file(path);
  if (is_folder_path(path)) {
    std::error_code ec;
    fs::create_directories(path, ec);
    if (ec) fail("--export '{}': cannot create the folder ({})", path, ec.message());
    // config.json first, then the weights (written atomically): a folder with weights has
    // its config.
    io::write_file((fs::path(path) / "config.json").string(), hf_config_json(c));
  }
  write_safetensors(file, arrays, meta);
}

HfWeights read_hf_weights(const std::string& file_or_folder) {
  HfWeights w;
  std::error_code ec;
  if (fs::is_directory(file_or_folder, ec)) {
    const fs::path folder(file_or_folder);
    w.path = (folder / "model.safetensors").string();
    // A meshtrain checkpoint (step-N with index.json, or a --checkpoint-dir holding them) is
    // sharded optimizer state, not weights: `meshtrain export` turns it into weights.
    bool checkpoint = fs::exists(folder / "index.json", ec) || fs::exists(folder / "latest", ec);
    for (const auto& e : fs::directory_iterator(folder, ec))
      if (e.path().filename().string().rfind("step-", 0) == 0) checkpoint = true;
    if (!fs::exists(w.path, ec) && checkpoint)
      fail(
          "'{}' is a meshtrain checkpoint, not Hugging Face weights: write its weights with "
          "`meshtrain export {} --out weights.safetensors` and name that file (to go on "
          "training from it, use train --resume)",
          file_or_folder, file_or_folder);
    // The hub splits a model past a few GB over shards named by an index.
    if (!fs::exists(w.path, ec) && fs::exists(folder / kSafetensorsIndexName, ec))
      w.path = (folder / kSafetensorsIndexName).string();
    else if (!fs::exists(w.path, ec))
      fail(
          "weights folder '{}' holds neither model.safetensors nor {} (a Hugging Face model "
          "folder, as `meshtrain train --export FOLDER` writes, has one of them)",
          file_or_folder, kSafetensorsIndexName);
    const std::string cfg = (folder / "config.json").string();
    if (fs::exists(cfg, ec)) w.config_path = cfg;
  } else {
    w.path = file_or_folder;
    const fs::path cfg = fs::path(file_or_folder).parent_path() / "config.json";
    // Beside a file, a config.json counts only for Llama weights (checked below).
    if (fs::exists(cfg, ec)) w.config_path = cfg.string();
  }
  const std::string index_suffix = ".index.json";
  const bool sharded =
      w.path.size() > index_suffix.size() &&
      w.path.compare(w.path.size() - index_suffix.size(), index_suffix.size(), index_suffix) == 0;
  w.file = sharded ? read_safetensors_shards(w.path) : read_safetensors(w.path);
  return w;
}

model::GptConfig config_from_hf(const HfWeights& w, std::optional<int64_t> n_head_hint) {
  const SafetensorsFile& f = w.file;
  const std::string& path = w.path;
  if (f.arrays.count("model.embed_tokens.weight")) {  // Llama names
    if (w.config_path.empty())
      fail(
          "weights file '{}' holds Llama weights, whose heads, kv heads and rope settings are "
          "not in the shapes: give the folder with its config.json (meshtrain --export writes "
          "one when --export names a folder)",
          path);
    json j;
    try {
      std::ifstream in(w.config_path);
      std::stringstream text;
      text << in.rdbuf();
      j = parse_json(text.str());  // nesting bounded (core/json.h)
    } catch (const std::exception& e) {
      fail("config '{}' is not valid JSON: {}", w.config_path, e.what());
    }
    if (!j.is_object()) fail("config '{}' must hold a JSON object", w.config_path);
    const std::string type = j.contains("model_type") && j.at("model_type").is_string()
                                 ? j.at("model_type").get<std::string>()
                                 : "";
    if (type != "llama" && type != "mixtral")
      fail("config '{}': model_type must be \"llama\" or \"mixtral\" for weights in Llama names",
           w.config_path);
    if (type == "mixtral" && !j.contains("num_local_experts"))
      fail("config '{}': a mixtral config needs \"num_local_experts\"", w.config_path);
    model::GptConfig c = llama_config_from_json(j, w.config_path);
    if (n_head_hint && *n_head_hint != c.n_head)
      fail("--n-head {} disagrees with num_attention_heads {} in '{}'", *n_head_hint, c.n_head,
           w.config_path);
    check_config_against_file(c, f, path, w.config_path);
    try {
      c.validate();
    } catch (const Error& e) {
      fail("config '{}' describes no valid Llama model: {}", w.config_path, e.what());
    }
    // Every tensor of that model is in the file with its shape (see below).
    for (const model::ParamSpec& s : model::gpt_param_specs(c)) check_tensor(f, path, s, c);
    return c;
  }
  auto need = [&](const std::string& name, size_t rank) -> const NamedArray& {
    auto it = f.arrays.find(name);
    if (it == f.arrays.end())
      fail(
          "weights file '{}' has no tensor '{}': not a GPT-2 or Llama checkpoint in Hugging Face "
          "names",
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
  for (const model::ParamSpec& s : model::gpt_param_specs(c)) check_tensor(f, path, s, c);
  return c;
}

std::vector<float> hf_global_tensor(const SafetensorsFile& f, const std::string& path,
                                    const model::ParamSpec& spec, const model::GptConfig& c) {
  model::ParamSpec g = spec;  // the whole tensor
  g.shape = spec.full_shape();
  g.global_shape = {};
  g.tp_rank = 0;
  g.tp_size = 1;
  const int64_t cols = g.shape.size() > 1 ? g.shape.back() : 1;
  std::vector<float> out(static_cast<size_t>(shape_numel(g.shape)), 0.0f);
  for (const HfPart& part : hf_parts(g, c)) {
    auto it = f.arrays.find(part.name);
    if (it == f.arrays.end())
      fail("weights file '{}' has no tensor '{}' that this model needs", path, part.name);
    const NamedArray& a = it->second;
    const Shape want = part_shape(g, part);
    if (a.shape != want)
      fail(
          "weights file '{}': tensor '{}' has shape {} but the model needs {} (do the model "
          "flags match the file?)",
          path, part.name, shape_str(a.shape), shape_str(want));
    float* dst = out.data() + part.row0 * cols;
    if (g.hf_transposed) {
      const int64_t rows = part.rows;
      for (int64_t o = 0; o < rows; ++o)
        for (int64_t i = 0; i < cols; ++i) dst[o * cols + i] = a.data[i * rows + o];
    } else {
      std::copy(a.data.begin(), a.data.end(), dst);
    }
  }
  return out;
}

void load_hf_weights(model::Gpt& gpt, const SafetensorsFile& f, const std::string& path) {
  const auto& c = gpt.config();
  for (auto& p : gpt.params().params()) {
    const int64_t cols = p.spec.shape.size() > 1 ? p.spec.shape.back() : 1;
    p.value.zero_();  // padding rows stay zero
    for (const HfPart& part : hf_parts(p.spec, c)) {
      auto it = f.arrays.find(part.name);
      if (it == f.arrays.end())
        fail("weights file '{}' has no tensor '{}' that this model needs", path, part.name);
      const NamedArray& a = it->second;
      const Shape want = part_shape(p.spec, part);
      if (a.shape != want)
        fail(
            "weights file '{}': tensor '{}' has shape {} but the model needs {} (do the model "
            "flags match the file?)",
            path, part.name, shape_str(a.shape), shape_str(want));
      float* dst = p.value.f32() + part.row0 * cols;
      if (p.spec.hf_transposed) {
        const int64_t out = part.rows, in = cols;
        for (int64_t o = 0; o < out; ++o)
          for (int64_t i = 0; i < in; ++i) dst[o * in + i] = a.data[i * out + o];
      } else {
        std::copy(a.data.begin(), a.data.end(), dst);
      }
    }
  }
}

}  // namespace mt::train

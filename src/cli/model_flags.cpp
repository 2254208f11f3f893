#include "cli/model_flags.h"

#include <fmt/ranges.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <limits>
#include <type_traits>

#include "core/error.h"
#include "core/json.h"

namespace mt::cli {

void ModelFlags::add_to(CLI::App& app) {
  app.add_option("--model", model,
                 fmt::format("preset: {}", fmt::join(model::preset_names(), ", ")));
  app.add_option("--n-layer", n_layer, "transformer blocks");
  app.add_option("--n-head", n_head, "attention heads");
  app.add_option("--n-kv-head", n_kv_head,
                 "key/value heads of grouped-query attention (divides --n-head; = --n-head: "
                 "multi-head, 1: multi-query; default: the preset's)");
  app.add_option("--rope-theta", rope_theta,
                 "rotary base frequency of a Llama-family model (Llama 3: 500000, Llama 2: "
                 "10000)");
  app.add_option("--d-model", d_model, "hidden width");
  app.add_option("--d-ff", d_ff, "MLP width (default 4 x d_model when --d-model is given)");
  app.add_option("--vocab", vocab, "vocabulary size (padded internally to a multiple of 128)");
  app.add_option("--seq", seq, "sequence length");
  app.add_flag("--no-bias", no_bias, "no biases in linear layers and layer norms");
  app.add_flag("--untied", untied, "separate LM-head weights (default: tied to the embedding)");
  app.add_option("--moe-experts", moe_experts,
                 "routed experts in place of the MLP (0: dense; docs/moe.md; default: the "
                 "preset's, e.g. mixtral-tiny 8)");
  app.add_option("--moe-top-k", moe_top_k, "experts per token (default: the preset's, or 2)");
  app.add_option("--moe-every", moe_every,
                 "every k-th block is MoE: block i when (i + 1) % k == 0 (default 1: all)");
  app.add_option("--moe-ff", moe_ff, "each expert's hidden width (default --d-ff)");
  app.add_option("--moe-shared-ff", moe_shared_ff,
                 "width of a shared expert every token goes through (default 0: none)");
  app.add_option("--moe-router", moe_router,
                 "gates: softmax-topk (Mixtral: softmax over all experts, top k, renormalised) "
                 "or topk-softmax (top-k logits, then softmax; the same numbers to rounding)");
}

template <class T>
T config_value(const nlohmann::json& j, const char* key) {
  const nlohmann::json& v = j.at(key);
  const char* wanted = nullptr;
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) wanted = "true or false";
  } else if constexpr (std::is_integral_v<T>) {
    if (!v.is_number_integer()) wanted = "an integer";
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number()) wanted = "a number";
  } else {
    if (!v.is_string()) wanted = "a string";
  }
  if (wanted) fail("config key '{}' must be {}, not {}", key, wanted, v.dump());
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    using Limits = std::numeric_limits<T>;
    bool fits;
    if (v.is_number_unsigned()) {
      fits = v.get<uint64_t>() <= static_cast<uint64_t>(Limits::max());
    } else {
      const int64_t x = v.get<int64_t>();
      fits = x < 0 ? std::is_signed_v<T> && x >= static_cast<int64_t>(Limits::min())
                   : static_cast<uint64_t>(x) <= static_cast<uint64_t>(Limits::max());
    }
    if (!fits) fail("config key '{}' is out of range: {}", key, v.dump());
  }
  return v.get<T>();
}

template bool config_value<bool>(const nlohmann::json&, const char*);
template int config_value<int>(const nlohmann::json&, const char*);
template int64_t config_value<int64_t>(const nlohmann::json&, const char*);
template uint64_t config_value<uint64_t>(const nlohmann::json&, const char*);
template float config_value<float>(const nlohmann::json&, const char*);
template double config_value<double>(const nlohmann::json&, const char*);
template std::string config_value<std::string>(const nlohmann::json&, const char*);

void ModelFlags::apply(model::GptConfig& c, const nlohmann::json& j) const {
  auto get = [&](const char* key, int64_t& field, const std::optional<int64_t>& flag) {
    take_config(j, key, field, flag);
  };
  std::string name = j.contains("model") ? config_value<std::string>(j, "model") : "tiny";
  if (model) name = *model;
  c = model::preset(name);
  const bool d_given = d_model || j.contains("d_model");
  get("n_layer", c.n_layer, n_layer);
  get("n_head", c.n_head, n_head);
  get("n_kv_head", c.n_kv_head, n_kv_head);
  take_config(j, "rope_theta", c.rope_theta, rope_theta);
  // A new width keeps the preset's d_ff / d_model (GPT-2: 4; Llama's SwiGLU widths: theirs).
  const double ff_ratio = static_cast<double>(c.d_ff) / static_cast<double>(c.d_model);
  get("d_model", c.d_model, d_model);
  if (d_given) c.d_ff = std::llround(ff_ratio * static_cast<double>(c.d_model));
  get("d_ff", c.d_ff, d_ff);
  get("vocab", c.vocab, vocab);
  get("seq", c.seq_len, seq);
  if (j.contains("bias")) c.bias = config_value<bool>(j, "bias");
  if (no_bias) c.bias = false;
  if (j.contains("tied")) c.tied = config_value<bool>(j, "tied");
  if (untied) c.tied = false;
  get("moe_experts", c.moe.n_experts, moe_experts);
  get("moe_top_k", c.moe.top_k, moe_top_k);
  get("moe_every", c.moe.every, moe_every);
  get("moe_ff", c.moe.d_ff_expert, moe_ff);
  get("moe_shared_ff", c.moe.d_ff_shared, moe_shared_ff);
  std::string router = model::router_order_name(c.moe.order);
  take_config(j, "moe_router", router, moe_router);
  c.moe.order = model::parse_router_order(router);
  const bool moe_changed = moe_experts || moe_top_k || moe_every || moe_ff || moe_shared_ff ||
                           moe_router || j.contains("moe_experts");
  const bool custom = n_layer || n_head || n_kv_head || rope_theta || d_model || d_ff || vocab ||
                      seq || no_bias || untied || moe_changed || j.contains("n_layer") ||
                      j.contains("d_model");
  if (custom) c.name = name_of_shape(c, model || j.contains("model") ? name : "");
  c.validate();
}

std::string name_of_shape(const model::GptConfig& c, const std::string& base) {
  if (!base.empty()) return base + " (modified)";
  // Without --model the shape is the flags': a preset's name where it is that preset, the
  // preset whose blocks it has (and what differs), else "custom".
  for (const std::string& p : model::preset_names()) {
    const model::GptConfig q = model::preset(p);
    if (c.same_model(q)) return p;
    if (c.n_layer != q.n_layer || c.n_head != q.n_head || c.d_model != q.d_model ||
        c.d_ff != q.d_ff || c.kv_heads() != q.kv_heads() || c.norm != q.norm || c.mlp != q.mlp ||
        c.positions != q.positions)
      continue;
    std::vector<std::string> diff;
    if (c.vocab != q.vocab) diff.push_back(fmt::format("vocab {}", c.vocab));
    if (c.seq_len != q.seq_len) diff.push_back(fmt::format("seq {}", c.seq_len));
    if (c.bias != q.bias) diff.push_back(c.bias ? "biases" : "no biases");
    if (c.tied != q.tied) diff.push_back(c.tied ? "tied" : "untied");
    if (c.rope_theta != q.rope_theta) diff.push_back(fmt::format("rope theta {}", c.rope_theta));
    return fmt::format("{}-shaped ({})", p, fmt::join(diff, ", "));
  }
  // The default preset's width with other depth, vocabulary or length: still tiny's blocks.
  const model::GptConfig tiny = model::preset("tiny");
  if (c.n_head == tiny.n_head && c.d_model == tiny.d_model && c.d_ff == tiny.d_ff &&
      c.mlp == tiny.mlp && c.positions == tiny.positions)
    return "tiny (modified)";
  return "custom";
}

nlohmann::json read_config_file(const std::string& path, const std::vector<std::string>& known) {
  if (path.empty()) return nlohmann::json::object();
  std::ifstream in(path);
  if (!in) fail("cannot open config file '{}'", path);
  nlohmann::json j;
  try {
    const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    j = parse_json(text);
  } catch (const std::exception& e) {  // a parse error, nesting too deep, or a read error
    fail("config file '{}' is not valid JSON: {}", path, e.what());
  }
  if (!j.is_object()) fail("config file '{}' must hold a JSON object", path);
  for (auto& [key, value] : j.items())
    if (std::find(known.begin(), known.end(), key) == known.end())
      fail("config file '{}': unknown key '{}' (known keys: {})", path, key,
           fmt::join(known, ", "));
  return j;
}

}  // namespace mt::cli

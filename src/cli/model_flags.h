// The model-shape flags shared by train, eval (and later plan/simulate): a preset or a
// JSON config, then each field overridable by a flag.
#pragma once

#include <CLI/CLI.hpp>
#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "core/error.h"
#include "model/config.h"

namespace mt::cli {

struct ModelFlags {
  std::optional<std::string> model;
  std::optional<int64_t> n_layer, n_head, n_kv_head, d_model, d_ff, vocab, seq;
  std::optional<double> rope_theta;
  // Mixture of experts (model::MoeConfig): experts (0: dense), top-k, every k-th block,
  // the experts' and the shared expert's widths, the router's order.
  std::optional<int64_t> moe_experts, moe_top_k, moe_every, moe_ff, moe_shared_ff;
  std::optional<std::string> moe_router;
  bool no_bias = false;
  bool untied = false;

  void add_to(CLI::App& app);
  // Applies the JSON config's model fields, then the flags, to `c`.
  void apply(model::GptConfig& c, const nlohmann::json& config_file) const;
};

// The name a run prints for a model whose shape flags changed a preset: "BASE (modified)"
// when --model BASE was given; without --model, the preset it equals, "gpt2-124m-shaped
// (vocab 50304, seq 256)" when it has a preset's blocks, "tiny (modified)" when it keeps the
// default preset's width, else "custom".
std::string name_of_shape(const model::GptConfig& c, const std::string& base);

// Reads a JSON config file, refusing a missing or malformed one, or an unknown key.
nlohmann::json read_config_file(const std::string& path, const std::vector<std::string>& known);

// The config's `key` as T, refusing a value of another JSON type by name: an integer field
// takes only an integer (8.7 is refused, not truncated to 8), a number field any number.
template <class T>
T config_value(const nlohmann::json& j, const char* key);

// Sets `field` from the config's `key` if present, then from the flag if given (flags win).
template <class T, class Flag>
void take_config(const nlohmann::json& j, const char* key, T& field, const Flag& flag) {
  if (j.contains(key)) field = config_value<T>(j, key);
  if (!flag) return;
  using V = std::decay_t<decltype(*flag)>;
  if constexpr (std::is_integral_v<T> && std::is_integral_v<V> && !std::is_same_v<T, bool>) {
    if (!std::in_range<T>(*flag)) {
      std::string name = key;
      std::replace(name.begin(), name.end(), '_', '-');
      fail("--{} {} is out of range", name, *flag);
    }
  }
  field = static_cast<T>(*flag);
}

}  // namespace mt::cli

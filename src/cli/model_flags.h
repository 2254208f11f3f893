// The model-shape flags shared by train, eval (and later plan/simulate): a preset or a
// JSON config, then each field overridable by a flag.
#pragma once

#include <optional>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "model/config.h"

namespace mt::cli {

struct ModelFlags {
  std::optional<std::string> model;
  std::optional<int64_t> n_layer, n_head, d_model, d_ff, vocab, seq;
  bool no_bias = false;
  bool untied = false;

  void add_to(CLI::App& app);
  // Applies the JSON config's model fields, then the flags, to `c`.
  void apply(model::GptConfig& c, const nlohmann::json& config_file) const;
};

// Reads a JSON config file, refusing a missing or malformed one, or an unknown key.
nlohmann::json read_config_file(const std::string& path, const std::vector<std::string>& known);

}  // namespace mt::cli

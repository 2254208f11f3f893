#include "plan/models.h"

#include <fmt/ranges.h>

#include "core/error.h"

namespace mt::plan {

namespace {

// Megatron-LM GPT: vocabulary 51,200, sequence 2,048, d_ff = 4h, learned positions, tied.
ModelSpec megatron(const char* name, int64_t heads, int64_t hidden, int64_t layers) {
  ModelSpec m;
  m.name = name;
  m.n_layer = layers;
  m.n_head = m.n_kv_head = heads;
  m.d_model = hidden;
  m.d_ff = 4 * hidden;
  m.vocab = 51200;
  m.seq = 2048;
  return m;
}

// A published model the engine also has as a preset (model/config.cpp: one description),
// under the planner's name for it.
ModelSpec engine_preset(const char* plan_name, const char* engine_name) {
  ModelSpec m = from_gpt(model::preset(engine_name));
  m.name = plan_name;
  return m;
}

const std::vector<ModelSpec>& published() {
  static const std::vector<ModelSpec> list = {
      // Narayanan et al. 2021, Table 1 (heads, hidden, layers).
      megatron("megatron-1.7b", 24, 2304, 24),
      megatron("megatron-3.6b", 32, 3072, 30),
      megatron("megatron-7.5b", 32, 4096, 36),
      megatron("megatron-18b", 48, 6144, 40),
      megatron("megatron-39b", 64, 8192, 48),
      megatron("megatron-76b", 80, 10240, 60),
      megatron("megatron-145b", 96, 12288, 80),
      megatron("megatron-310b", 128, 16384, 96),
      megatron("megatron-530b", 128, 20480, 105),
      megatron("megatron-1t", 160, 25600, 128),
      // GPT-3 175B (Brown et al. 2020, Table 2.1) with Megatron's vocabulary.
      megatron("gpt3-175b", 96, 12288, 96),
      // Llama 3 405B as Meta trained it (Dubey et al. 2024, Table 3): the engine's
      // llama3.1-405b preset (llama3-8b and llama3-70b are engine presets under their names).
      engine_preset("llama3-405b", "llama3.1-405b"),
  };
  return list;
}

}  // namespace

double ModelSpec::moe_mlp_params() const {
  const double C = d_model, E = double(n_experts), Fe = d_ff_expert, Fs = d_ff_shared;
  double p = C * E + E * mlp_mats() * C * Fe + mlp_mats() * C * Fs;
  if (bias) p += E * (Fe + C) + (Fs > 0 ? Fs + C : 0);
  return p;
}

double ModelSpec::block_expert_params() const {
  if (!is_moe()) return 0;
  const double per = double(n_experts) * (mlp_mats() * double(d_model) * d_ff_expert +
                                          (bias ? double(d_ff_expert) + d_model : 0.0));
  return per * double(moe_layers) / double(n_layer);
}

double ModelSpec::block_moe_replicated_params(bool shared_whole) const {
  if (!is_moe()) return 0;
  const double C = d_model, Fs = d_ff_shared;
  double p = C * double(n_experts);  // the router
  if (shared_whole) p += mlp_mats() * C * Fs + (bias && Fs > 0 ? Fs + C : 0.0);
  return p * double(moe_layers) / double(n_layer);
}

double ModelSpec::active_ff(double expert_load) const {
  if (!is_moe()) return double(d_ff);
  // The router's C·E weights as MLP width: C·E = mats·C·w.
  const double moe = expert_load * double(top_k) * d_ff_expert + double(d_ff_shared) +
                     double(n_experts) / mlp_mats();
  return (double(n_layer - moe_layers) * d_ff + double(moe_layers) * moe) / double(n_layer);
}

double ModelSpec::block_params() const {
  const double C = d_model, F = d_ff, kv = kv_dim();
  double p = C * (C + 2 * kv) + C * C;
  if (bias)
    p += (C + 2 * kv) + C + 4 * C;  // attention biases + 2 layer norms (w, b)
  else
    p += 2 * C;  // 2 RMS norm weights
  const double dense = mlp_mats() * C * F + (bias ? F + C : 0.0);
  if (!is_moe()) return p + dense;
  return p + (double(n_layer - moe_layers) * dense + double(moe_layers) * moe_mlp_params()) /
                 double(n_layer);
}

double ModelSpec::block_replicated_params() const {
  const double C = d_model;
  if (!bias) return 2 * C;  // 2 RMS norm weights
  // 2 norms (w, b), the attention's output bias, and a dense MLP's output bias (an MoE block
  // has its experts' own).
  const double dense = is_moe() ? double(n_layer - moe_layers) / double(n_layer) : 1.0;
  return 4 * C + C + dense * C;
}

double ModelSpec::embedding_params_per_tp(int t) const {
  return static_cast<double>(vocab) * d_model / t + (learned_pos ? double(seq) * d_model : 0.0);
}

double ModelSpec::head_params_per_tp(int t) const {
  return (bias ? 2.0 : 1.0) * d_model + (tied ? 0.0 : static_cast<double>(vocab) * d_model / t);
}

double ModelSpec::total_params() const {
  return n_layer * block_params() + embedding_params() + head_params();
}

double ModelSpec::matmul_params() const {
  const double C = d_model, kv = kv_dim();
  return n_layer * (C * (C + 2 * kv) + C * C + mlp_mats() * C * active_ff()) + double(vocab) * C;
}

double ModelSpec::active_params() const {
  const double inactive = is_moe() ? double(moe_layers) * double(n_experts - top_k) *
                                         (mlp_mats() * double(d_model) * d_ff_expert +
                                          (bias ? double(d_ff_expert) + d_model : 0.0))
                                   : 0.0;
  return total_params() - inactive;
}

ModelSpec from_gpt(const model::GptConfig& c) {
  ModelSpec m;
  m.name = c.name;
  m.n_layer = c.n_layer;
  m.n_head = c.n_head;
  m.n_kv_head = c.kv_heads();
  m.d_model = c.d_model;
  m.d_ff = c.d_ff;
  m.vocab = c.padded_vocab();
  m.vocab_real = c.vocab;
  m.seq = c.seq_len;
  m.bias = c.bias;
  m.tied = c.tied;
  m.swiglu = c.mlp == model::MlpKind::kSwiGlu;
  m.learned_pos = c.positions == model::Positions::kLearned;
  m.dropout = !c.llama_family();  // the Llama recipes train without dropout
  if (c.moe.enabled()) {
    m.n_experts = c.moe.n_experts;
    m.top_k = c.moe.top_k;
    m.d_ff_expert = c.expert_ff();
    m.d_ff_shared = c.moe.d_ff_shared;
    m.moe_layers = c.n_moe_layers();
  }
  return m;
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names = model::preset_names();
  for (const auto& m : published()) names.push_back(m.name);
  return names;
}

ModelSpec model_preset(const std::string& name) {
  for (const auto& m : published())
    if (m.name == name) return m;
  for (const auto& n : model::preset_names())
    if (n == name) return from_gpt(model::preset(name));
  fail("unknown model '{}' (choose one of {})", name, fmt::join(model_preset_names(), ", "));
}

double model_flops_per_token(const ModelSpec& m, int64_t seq) {
  return 6.0 * m.matmul_params() + 12.0 * m.n_layer * double(m.d_model) * double(seq);
}

double hw_flops_per_token(const ModelSpec& m, int64_t seq, Recompute r) {
  const double head = double(m.vocab) * m.d_model;
  const double blocks = m.matmul_params() - head;
  const double attn = 2.0 * m.n_layer * double(m.d_model) * double(seq);  // forward
  switch (r) {
    case Recompute::kNone:
      return 6 * blocks + 6 * head + 6 * attn;
    case Recompute::kSelective:
      return 6 * blocks + 6 * head + 8 * attn;
    case Recompute::kFull:
      return 8 * blocks + 6 * head + 8 * attn;
  }
  return 0;
}

}  // namespace mt::plan

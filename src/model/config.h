// The shape of a model, its presets, and the refusals of bad shapes. One description for
// every architecture: a block is a norm, attention with its position encoding, and an MLP;
// GPT-2 (LayerNorm, learned positions, GELU MLP, biases) and Llama (RMSNorm, rotary
// positions, SwiGLU MLP, grouped-query attention, no biases) are two settings of it. The
// fields are Hugging Face config.json's (hidden_size = d_model, intermediate_size = d_ff,
// num_key_value_heads = n_kv_head, rope_theta, rms_norm_eps, tie_word_embeddings).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mt::model {

// The vocabulary is padded to a multiple of this (GPT-2's 50257 -> 50304) so that the
// embedding and LM-head GEMMs have friendly shapes; padded rows are zero and never
// change the loss.
constexpr int64_t kVocabPadMultiple = 128;

enum class NormKind : uint8_t { kLayerNorm, kRmsNorm };
enum class MlpKind : uint8_t { kGelu, kSwiGlu };     // GELU: down(gelu(fc(x))); SwiGLU below
enum class Positions : uint8_t { kLearned, kRope };  // a learned table, or rotary (q and k)

// Llama 3.1's rope_scaling (rope_type "llama3"): long wavelengths divided by `factor`, short
// ones kept, a smooth blend between (Hugging Face _compute_llama3_parameters).
struct RopeScaling {
  bool llama3 = false;  // false: plain RoPE
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position = 8192;
};

// Mixture of experts (docs/moe.md). The router's order: Mixtral's (softmax over all experts,
// then the top k, renormalised) or the top k logits first, then a softmax over those.
enum class RouterOrder : uint8_t { kSoftmaxTopK, kTopKSoftmax };

// Routed experts in place of the MLP (Hugging Face MixtralConfig / Qwen3MoeConfig /
// DeepseekV3Config fields). Every expert is the block's MLP kind (SwiGLU or GELU) of width
// d_ff_expert; a shared expert of width d_ff_shared (DeepSeek / Qwen2: n_shared_experts ·
// moe_intermediate_size) is always active beside them.
struct MoeConfig {
  int64_t n_experts = 0;    // num_local_experts / num_experts / n_routed_experts; 0: dense
  int64_t top_k = 2;        // num_experts_per_tok
  int64_t every = 1;        // decoder_sparse_step: block i is MoE when (i + 1) % every == 0
  int64_t first_dense = 0;  // first_k_dense_replace: blocks below are dense MLPs of d_ff
  int64_t d_ff_expert = 0;  // moe_intermediate_size (0: d_ff)
  int64_t d_ff_shared = 0;  // the shared expert's width (0: none)
  RouterOrder order = RouterOrder::kSoftmaxTopK;

  bool enabled() const { return n_experts > 0; }
  bool is_moe_layer(int64_t i) const {
    return enabled() && i >= first_dense && (i + 1) % every == 0;
  }
  bool operator==(const MoeConfig&) const = default;
};

struct GptConfig {
  std::string name = "custom";
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t d_model = 0;
  int64_t d_ff = 0;       // MLP hidden width (GPT-2: 4 * d_model)
  int64_t vocab = 0;      // real vocabulary
  int64_t seq_len = 0;    // maximum sequence length (rows of the position embedding)
  bool bias = true;       // biases in linear layers and layer norms
  bool tied = true;       // LM head shares the token embedding
  int64_t n_kv_head = 0;  // grouped-query attention: key/value heads (0: n_head, multi-head)
  NormKind norm = NormKind::kLayerNorm;
  float norm_eps = 1e-5f;  // RMSNorm's (the LayerNorm kernel's is GPT-2's 1e-5)
  MlpKind mlp = MlpKind::kGelu;
  Positions positions = Positions::kLearned;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  // The vocabulary is padded to a multiple of this: 128, or lcm(128, tp) with tensor
  // parallelism so that every tp rank holds the same number of rows (tp_vocab_pad).
  int64_t vocab_pad_multiple = kVocabPadMultiple;
  MoeConfig moe;  // n_experts 0: every block has the dense MLP

  // The routed experts' width (d_ff unless the config names one).
  int64_t expert_ff() const { return moe.d_ff_expert > 0 ? moe.d_ff_expert : d_ff; }
  int64_t n_moe_layers() const {
    int64_t n = 0;
    for (int64_t i = 0; i < n_layer; ++i) n += moe.is_moe_layer(i);
    return n;
  }

  int64_t padded_vocab() const {
    return (vocab + vocab_pad_multiple - 1) / vocab_pad_multiple * vocab_pad_multiple;
  }
  int64_t head_dim() const { return d_model / n_head; }
  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int64_t kv_dim() const { return kv_heads() * head_dim(); }
  // Rows of the fused q|k|v projection (q: d_model, k and v: kv_dim each).
  int64_t qkv_dim() const { return d_model + 2 * kv_dim(); }
  // Rows of the MLP's first projection: d_ff (GELU) or gate|up, 2·d_ff (SwiGLU).
  int64_t fc_dim() const { return mlp == MlpKind::kSwiGlu ? 2 * d_ff : d_ff; }
  bool llama_family() const { return positions == Positions::kRope; }
  // Everything that makes two configs the same model (not its name nor padding).
  bool same_model(const GptConfig& o) const;
  // Refuses an impossible shape with a message naming the value and the fix.
  void validate() const;
};

// Tensor parallelism over tp ranks (with sequence parallelism when sp): refuses, before
// any work, a tp that does not divide n_head or d_ff, or (sp) the sequence length, with a
// message naming the valid values.
void check_tp(const GptConfig& c, int tp, bool sp);
// lcm(128, tp): the vocabulary padding that splits evenly over tp ranks.
int64_t tp_vocab_pad(int tp);

const char* norm_name(NormKind n);             // "layernorm", "rmsnorm"
const char* mlp_name(MlpKind m);               // "gelu", "swiglu"
const char* positions_name(Positions p);       // "learned", "rope"
const char* router_order_name(RouterOrder o);  // "softmax-topk", "topk-softmax"
RouterOrder parse_router_order(const std::string& s);
NormKind parse_norm(const std::string& s);  // refuses another name, naming the valid ones
MlpKind parse_mlp(const std::string& s);
Positions parse_positions(const std::string& s);

GptConfig preset(const std::string& name);
std::vector<std::string> preset_names();

}  // namespace mt::model

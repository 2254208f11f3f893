#include "model/config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace mt::model {

namespace {
GptConfig make(const char* name, int64_t layers, int64_t heads, int64_t d, int64_t vocab,
               int64_t seq) {
  GptConfig c;
  c.name = name;
  c.n_layer = layers;
  c.n_head = heads;
  c.d_model = d;
  c.d_ff = 4 * d;
  c.vocab = vocab;
  c.seq_len = seq;
  return c;
}

// A Llama-family model (Hugging Face LlamaConfig's fields): RMSNorm, RoPE, SwiGLU of width
// `ff`, `kv` key/value heads, no biases.
GptConfig llama(const char* name, int64_t layers, int64_t heads, int64_t kv, int64_t d, int64_t ff,
                int64_t vocab, int64_t seq, bool tied, double theta) {
  GptConfig c = make(name, layers, heads, d, vocab, seq);
  c.d_ff = ff;
  c.n_kv_head = kv;
  c.norm = NormKind::kRmsNorm;
  c.norm_eps = 1e-5f;
  c.mlp = MlpKind::kSwiGlu;
  c.positions = Positions::kRope;
  c.rope_theta = theta;
  c.bias = false;
  c.tied = tied;
  return c;
}

// A Mixtral-family model: a Llama whose MLPs are `experts` routed SwiGLU experts, top `k`.
GptConfig mixtral(GptConfig c, int64_t experts, int64_t k) {
  c.moe.n_experts = experts;
  c.moe.top_k = k;
  return c;
}

// Llama 3.1 and 3.2's rope_scaling: {"rope_type": "llama3", "factor", "low_freq_factor": 1,
// "high_freq_factor": 4, "original_max_position_embeddings": 8192}.
GptConfig scaled(GptConfig c, double factor) {
  c.rope_scaling.llama3 = true;
  c.rope_scaling.factor = factor;
  c.rope_scaling.low_freq_factor = 1.0;
  c.rope_scaling.high_freq_factor = 4.0;
  c.rope_scaling.original_max_position = 8192;
  return c;
}
}  // namespace

std::vector<std::string> preset_names() {
  return {"tiny",          "gpt2-124m",    "gpt2-350m",    "gpt2-774m",     "gpt2-1.5b",
          "llama-tiny",    "llama3.2-1b",  "llama3.2-3b",  "llama3-8b",     "llama3-70b",
          "llama3.1-405b", "mixtral-tiny", "mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3"};
}

GptConfig preset(const std::string& name) {
  // `tiny` is byte-level (vocab 256) so that it trains on `meshtrain prepare` output.
  if (name == "tiny") return make("tiny", 4, 4, 128, 256, 128);
  if (name == "gpt2-124m") return make("gpt2-124m", 12, 12, 768, 50257, 1024);
  if (name == "gpt2-350m") return make("gpt2-350m", 24, 16, 1024, 50257, 1024);
  if (name == "gpt2-774m") return make("gpt2-774m", 36, 20, 1280, 50257, 1024);
  if (name == "gpt2-1.5b") return make("gpt2-1.5b", 48, 25, 1600, 50257, 1024);
  // `llama-tiny` is byte-level like `tiny`: 4 layers, 4 query heads sharing 2 kv heads.
  if (name == "llama-tiny") return llama("llama-tiny", 4, 4, 2, 128, 352, 256, 128, true, 10000);
  // The published configs (Hugging Face meta-llama/*: config.json). seq is the pre-training
  // context (8192); the scaled ones extend to 131072 positions through rope_scaling.
  if (name == "llama3.2-1b")
    return scaled(llama("llama3.2-1b", 16, 32, 8, 2048, 8192, 128256, 8192, true, 500000), 32);
  if (name == "llama3.2-3b")
    return scaled(llama("llama3.2-3b", 28, 24, 8, 3072, 8192, 128256, 8192, true, 500000), 32);
  if (name == "llama3-8b")
    return llama("llama3-8b", 32, 32, 8, 4096, 14336, 128256, 8192, false, 500000);
  if (name == "llama3-70b")
    return llama("llama3-70b", 80, 64, 8, 8192, 28672, 128256, 8192, false, 500000);
  if (name == "llama3.1-405b")
    return scaled(llama("llama3.1-405b", 126, 128, 8, 16384, 53248, 128256, 8192, false, 500000),
                  8);
  // `mixtral-tiny`: llama-tiny's attention with 8 SwiGLU experts of width 176, top 2.
  if (name == "mixtral-tiny")
    return mixtral(llama("mixtral-tiny", 4, 4, 2, 128, 176, 256, 128, false, 10000), 8, 2);
  // mistralai/Mixtral-8x7B-v0.1 config.json (max_position_embeddings 32768).
  if (name == "mixtral-8x7b")
    return mixtral(llama("mixtral-8x7b", 32, 32, 8, 4096, 14336, 32000, 32768, false, 1e6), 8, 2);
  // Qwen/Qwen3-30B-A3B: 128 experts of 768, top 8 (norm_topk_prob: renormalised). Its
  // head_dim is 128 (not d_model / n_head = 64) and it normalises q and k: the engine has
  // neither, so this preset is for the planner (attention FLOPs within a few percent).
  if (name == "qwen3-30b-a3b") {
    GptConfig c =
        mixtral(llama("qwen3-30b-a3b", 48, 32, 4, 2048, 6144, 151936, 40960, false, 1e6), 128, 8);
    c.moe.d_ff_expert = 768;
    return c;
  }
  // deepseek-ai/DeepSeek-V3: 61 blocks (the first 3 dense, d_ff 18432), 256 routed experts of
  // 2048 and one shared, top 8. Its attention is MLA, which the engine does not run; here it
  // is shaped as 128-head attention of the same width, for the planner's MoE arithmetic.
  if (name == "deepseek-v3") {
    GptConfig c =
        mixtral(llama("deepseek-v3", 61, 128, 128, 7168, 18432, 129280, 4096, false, 1e4), 256, 8);
    c.moe.d_ff_expert = 2048;
    c.moe.d_ff_shared = 2048;
    c.moe.first_dense = 3;
    return c;
  }
  fail("unknown model preset '{}' (choose one of {}, or give --config FILE.json)", name,
       fmt::join(preset_names(), ", "));
}

bool GptConfig::same_model(const GptConfig& o) const {
  const RopeScaling &a = rope_scaling, &b = o.rope_scaling;
  return n_layer == o.n_layer && n_head == o.n_head && d_model == o.d_model && d_ff == o.d_ff &&
         vocab == o.vocab && seq_len == o.seq_len && bias == o.bias && tied == o.tied &&
         kv_heads() == o.kv_heads() && norm == o.norm && norm_eps == o.norm_eps && mlp == o.mlp &&
         positions == o.positions && rope_theta == o.rope_theta && a.llama3 == b.llama3 &&
         (!a.llama3 || (a.factor == b.factor && a.low_freq_factor == b.low_freq_factor &&
                        a.high_freq_factor == b.high_freq_factor &&
                        a.original_max_position == b.original_max_position)) &&
         moe == o.moe;
}

const char* norm_name(NormKind n) { return n == NormKind::kRmsNorm ? "rmsnorm" : "layernorm"; }
const char* mlp_name(MlpKind m) { return m == MlpKind::kSwiGlu ? "swiglu" : "gelu"; }
const char* positions_name(Positions p) { return p == Positions::kRope ? "rope" : "learned"; }

const char* router_order_name(RouterOrder o) {
  return o == RouterOrder::kTopKSoftmax ? "topk-softmax" : "softmax-topk";
}
RouterOrder parse_router_order(const std::string& s) {
  if (s == "softmax-topk") return RouterOrder::kSoftmaxTopK;
  if (s == "topk-softmax") return RouterOrder::kTopKSoftmax;
  fail("router order '{}' is not one (choose softmax-topk, Mixtral's, or topk-softmax)", s);
}

NormKind parse_norm(const std::string& s) {
  if (s == "layernorm") return NormKind::kLayerNorm;
  if (s == "rmsnorm") return NormKind::kRmsNorm;
  fail("norm '{}' is not a normalisation (choose layernorm or rmsnorm)", s);
}
MlpKind parse_mlp(const std::string& s) {
  if (s == "gelu") return MlpKind::kGelu;
  if (s == "swiglu") return MlpKind::kSwiGlu;
  fail("mlp '{}' is not an MLP kind (choose gelu or swiglu)", s);
}
Positions parse_positions(const std::string& s) {
  if (s == "learned") return Positions::kLearned;
  if (s == "rope") return Positions::kRope;
  fail("positions '{}' is not a position encoding (choose learned or rope)", s);
}

void GptConfig::validate() const {
  auto positive = [](const char* flag, int64_t v) {
    if (v < 1) fail("{} {} must be at least 1", flag, v);
  };
  positive("--n-layer", n_layer);
  positive("--n-head", n_head);
  positive("--d-model", d_model);
  positive("--d-ff", d_ff);
  positive("--vocab", vocab);
  positive("--seq", seq_len);
  if (d_model % n_head != 0) {
    std::vector<int64_t> ok;  // up to 64 heads: not a scan up to d_model (it may be 10^15)
    for (int64_t h = 1; h <= std::min<int64_t>(d_model, 64); ++h)
      if (d_model % h == 0) ok.push_back(h);
    fail("--d-model {} is not divisible by --n-head {} (choose n_head among {})", d_model, n_head,
         fmt::join(ok, ", "));
  }
  if (n_kv_head < 0 || (n_kv_head > 0 && n_head % n_kv_head != 0)) {
    std::vector<int64_t> ok;  // up to 1024: not a scan up to n_head (a file may say 2^31)
    constexpr int64_t kMaxListed = 1024;
    for (int64_t k = 1; k <= std::min(n_head, kMaxListed); ++k)
      if (n_head % k == 0) ok.push_back(k);
    fail(
        "--n-kv-head {} does not divide --n-head {} (each key/value head serves a whole group "
        "of query heads; choose among {}{})",
        n_kv_head, n_head, fmt::join(ok, ", "), n_head > kMaxListed ? ", ..." : "");
  }
  if (positions == Positions::kRope && head_dim() % 2 != 0)
    fail(
        "rotary positions rotate pairs of a head's dimensions: head dim {} (d_model {} / n_head "
        "{}) must be even",
        head_dim(), d_model, n_head);
  if (positions == Positions::kRope && !(rope_theta > 1.0))
    fail("rope_theta {} must be above 1 (Llama 3: 500000, Llama 2: 10000)", rope_theta);
  if (norm == NormKind::kRmsNorm && !(norm_eps > 0))
    fail("norm_eps {} must be positive (Llama 3: 1e-5)", norm_eps);
  if (rope_scaling.llama3 && (!(rope_scaling.factor >= 1) || !(rope_scaling.low_freq_factor > 0) ||
                              !(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor) ||
                              rope_scaling.original_max_position < 1))
    fail(
        "rope_scaling (llama3): factor {} must be >= 1, 0 < low_freq_factor {} < "
        "high_freq_factor {}, original_max_position_embeddings {} >= 1",
        rope_scaling.factor, rope_scaling.low_freq_factor, rope_scaling.high_freq_factor,
        rope_scaling.original_max_position);
  if (moe.n_experts < 0) fail("n_experts {} must be 0 (dense) or more", moe.n_experts);
  if (moe.enabled()) {
    if (moe.top_k < 1 || moe.top_k > moe.n_experts)
      fail("--moe-top-k {} must be between 1 and the number of experts {}", moe.top_k,
           moe.n_experts);
    if (moe.every < 1) fail("--moe-every {} must be at least 1 (1: every block)", moe.every);
    if (moe.first_dense < 0 || moe.d_ff_expert < 0 || moe.d_ff_shared < 0)
      fail("first_dense {}, d_ff_expert {} and d_ff_shared {} must not be negative",
           moe.first_dense, moe.d_ff_expert, moe.d_ff_shared);
    if (n_moe_layers() == 0)
      fail("n_experts {} but no block is MoE (n_layer {}, every {}, first_dense {})", moe.n_experts,
           n_layer, moe.every, moe.first_dense);
  }
}

void check_tp(const GptConfig& c, int tp, bool sp) {
  if (tp < 1) fail("--tp {} must be at least 1", tp);
  if (sp && tp == 1) fail("--sp needs tensor parallelism (use --tp 2 or more with --sp)");
  auto valid = [&] {
    // The divisors up to kMaxListed: not a scan up to n_head (a config file may say 10^15).
    constexpr int64_t kMaxListed = 1024;
    std::vector<int64_t> ok;
    for (int64_t t = 1; t <= std::min(c.n_head, kMaxListed); ++t)
      if (c.n_head % t == 0 && c.kv_heads() % t == 0 && c.d_ff % t == 0 &&
          (!sp || c.seq_len % t == 0))
        ok.push_back(t);
    return fmt::format("{}{}", fmt::join(ok, ", "), c.n_head > kMaxListed ? ", ..." : "");
  };
  if (c.n_head % tp != 0)
    fail("--tp {} does not divide n_head={} (each rank owns whole heads; choose --tp among {})", tp,
         c.n_head, valid());
  if (c.kv_heads() % tp != 0)
    fail(
        "--tp {} does not divide n_kv_head={} (each rank owns whole key/value heads; choose --tp "
        "among {})",
        tp, c.kv_heads(), valid());
  if (c.d_ff % tp != 0)
    fail("--tp {} does not divide d_ff={} (choose --tp among {})", tp, c.d_ff, valid());
  if (sp && c.seq_len % tp != 0)
    fail(
        "--sp splits the sequence over the tp ranks, but --seq {} is not divisible by --tp {} "
        "(use a --seq that is a multiple of {}, or --tp among {})",
        c.seq_len, tp, tp, valid());
}

int64_t tp_vocab_pad(int tp) { return std::lcm<int64_t>(kVocabPadMultiple, tp); }

}  // namespace mt::model

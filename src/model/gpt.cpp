#include "model/gpt.h"

#include "core/error.h"
#include "core/profile.h"
#include "kernels/kernels.h"

namespace mt::model {

namespace {
Tensor acts(const Shape& s) { return Tensor::empty(s, DType::kF32, mem::Category::kActivations); }
Param* maybe(ParamStore& s, const std::string& name) {
  const Param* p = s.find(name);
  return const_cast<Param*>(p);
}
}  // namespace

Gpt::Gpt(const GptConfig& config, uint64_t seed, StoreOptions store)
    : config_(config), params_(gpt_param_specs(config), DType::kF32, store) {
  config_.validate();
  params_.initialize(seed);
  const int64_t C = config_.d_model, F = config_.d_ff;
  wte_ = &params_.get("transformer.wte.weight");
  wpe_ = &params_.get("transformer.wpe.weight");
  lm_head_ = config_.tied ? wte_ : &params_.get("lm_head.weight");
  ln_f_ = {&params_.get("transformer.ln_f.weight"), maybe(params_, "transformer.ln_f.bias"), C};
  for (int l = 0; l < config_.n_layer; ++l) {
    const std::string h = "transformer.h." + std::to_string(l) + ".";
    Block b;
    b.n_head = config_.n_head;
    b.ln_1 = {&params_.get(h + "ln_1.weight"), maybe(params_, h + "ln_1.bias"), C};
    b.c_attn = {&params_.get(h + "attn.c_attn.weight"), maybe(params_, h + "attn.c_attn.bias"), C,
                3 * C};
    b.attn_proj = {&params_.get(h + "attn.c_proj.weight"), maybe(params_, h + "attn.c_proj.bias"),
                   C, C};
    b.ln_2 = {&params_.get(h + "ln_2.weight"), maybe(params_, h + "ln_2.bias"), C};
    b.c_fc = {&params_.get(h + "mlp.c_fc.weight"), maybe(params_, h + "mlp.c_fc.bias"), C, F};
    b.mlp_proj = {&params_.get(h + "mlp.c_proj.weight"), maybe(params_, h + "mlp.c_proj.bias"), F,
                  C};
    blocks_.push_back(b);
  }
}

std::vector<int> Gpt::unit_first_params() const {
  auto index_of = [&](const Param* p) { return static_cast<int>(p - params_.params().data()); };
  std::vector<int> v{index_of(wte_)};
  for (const Block& b : blocks_) v.push_back(index_of(b.ln_1.w));
  v.push_back(index_of(ln_f_.w));
  v.push_back(static_cast<int>(params_.params().size()));
  return v;
}

Activations Gpt::make_activations(int64_t B, int64_t T) const {
  if (T > config_.seq_len)
    fail("sequence length {} is longer than the model's seq_len {} (use --seq {} or less)", T,
         config_.seq_len, config_.seq_len);
  const int64_t N = B * T, C = config_.d_model;
  Activations a;
  a.B = B;
  a.T = T;
  a.tokens.resize(N);
  a.targets.resize(N);
  a.encoded = acts({N, C});
  for (int l = 0; l < config_.n_layer; ++l)
    a.blocks.push_back(Block::make_activations(config_, B, T));
  a.lnf = acts({N, C});
  a.lnf_mean = acts({N});
  a.lnf_rstd = acts({N});
  a.logits = acts({N, config_.padded_vocab()});
  a.losses = acts({N});
  a.lse = acts({N});
  return a;
}

float Gpt::forward(Activations& a, const int32_t* inputs, const int32_t* targets) {
  const int64_t B = a.B, T = a.T, N = B * T, C = config_.d_model;
  std::copy(inputs, inputs + N, a.tokens.begin());
  std::copy(targets, targets + N, a.targets.begin());
  parallel::UnitHooks& hooks = hooks_ ? *hooks_ : no_hooks_;
  const int head = num_units() - 1;
  hooks.before_forward(0);
  {
    profile::Scope p("embedding.fwd");
    kernels::embedding_forward(a.encoded.f32(), a.tokens.data(), wte_->value.f32(),
                               wpe_->value.f32(), B, T, C);
  }
  const float* x = a.encoded.f32();
  for (size_t l = 0; l < blocks_.size(); ++l) {
    hooks.before_forward(static_cast<int>(l) + 1);
    blocks_[l].forward(a.blocks[l], x, B, T);
    x = a.blocks[l].out.f32();
  }
  hooks.before_forward(head);
  ln_f_.forward(a.lnf.f32(), a.lnf_mean.f32(), a.lnf_rstd.f32(), x, N);
  const int64_t Vp = config_.padded_vocab();
  {
    profile::Scope p("lm_head.fwd");
    kernels::linear_forward(a.logits.f32(), a.lnf.f32(), lm_head_->value.f32(), nullptr, N, C, Vp);
  }
  {
    profile::Scope p("cross_entropy.fwd");
    kernels::cross_entropy_forward(a.losses.f32(), a.lse.f32(), a.logits.f32(), a.targets.data(), N,
                                   config_.vocab, Vp);
  }
  double sum = 0;
  for (int64_t i = 0; i < N; ++i) sum += a.losses.f32()[i];
  return static_cast<float>(sum / static_cast<double>(N));
}

void Gpt::ensure_scratch(int64_t B, int64_t T) {
  if (B * T == scratch_tokens_ && scratch_.datt.defined() && scratch_.datt.dim(0) == B) return;
  scratch_ = Block::make_scratch(config_, B, T);
  dres_ = Tensor::empty({B * T, config_.d_model}, DType::kF32, mem::Category::kWorkspace);
  scratch_tokens_ = B * T;
}

void Gpt::backward(Activations& a, float dloss) {
  const int64_t B = a.B, T = a.T, N = B * T, C = config_.d_model;
  const int64_t Vp = config_.padded_vocab();
  ensure_scratch(B, T);
  parallel::UnitHooks& hooks = hooks_ ? *hooks_ : no_hooks_;
  const int head = num_units() - 1;
  hooks.before_backward(head);
  float* dlogits = a.logits.f32();  // in place
  {
    profile::Scope p("cross_entropy.bwd");
    kernels::cross_entropy_backward(dlogits, a.logits.f32(), a.lse.f32(), a.targets.data(), dloss,
                                    N, config_.vocab, Vp);
  }
  float* dlnf = scratch_.dln.f32();
  {
    profile::Scope p("lm_head.bwd");
    // Tied: only the input gradient now; wte's gradient is added with the embedding's.
    kernels::linear_backward(dlnf, config_.tied ? nullptr : lm_head_->grad.f32(), nullptr, dlogits,
                             a.lnf.f32(), lm_head_->value.f32(), N, C, Vp);
  }
  float* dres = dres_.f32();
  dres_.zero_();
  const float* last = blocks_.empty() ? a.encoded.f32() : a.blocks.back().out.f32();
  ln_f_.backward(dres, dlnf, last, a.lnf_mean.f32(), a.lnf_rstd.f32(), N);
  hooks.after_backward(head);
  for (int l = static_cast<int>(blocks_.size()) - 1; l >= 0; --l) {
    hooks.before_backward(l + 1);
    const float* x = l == 0 ? a.encoded.f32() : a.blocks[l - 1].out.f32();
    blocks_[l].backward(dres, scratch_, a.blocks[l], x, B, T);
    hooks.after_backward(l + 1);
  }
  hooks.before_backward(0);
  {
    profile::Scope p("embedding.bwd");
    kernels::embedding_backward(wte_->grad.f32(), wpe_->grad.f32(), dres, a.tokens.data(), B, T, C);
  }
  if (config_.tied) {
    profile::Scope p("lm_head.bwd");
    // d(wte) += d(logits)^T · lnf: the LM head's share, kept until now (dlogits and lnf
    // are still in the activations).
    kernels::linear_backward(nullptr, wte_->grad.f32(), nullptr, dlogits, a.lnf.f32(),
                             wte_->value.f32(), N, C, Vp);
  }
  hooks.after_backward(0);
}

double training_flops_per_token(const GptConfig& c, int64_t T) {
  const double L = c.n_layer, C = c.d_model, F = c.d_ff, Vp = c.padded_vocab();
  const double matmul_params = L * (3 * C * C + C * C + 2 * C * F) + Vp * C;
  // 2 FLOPs per multiply-add, x3 for forward + backward; attention scores and the
  // weighted sum (2 * 2 * T * C per token per layer forward) counted over the full T x T as
  // Megatron-LM and PaLM count them.
  return 6.0 * matmul_params + 12.0 * L * C * static_cast<double>(T);
}

}  // namespace mt::model

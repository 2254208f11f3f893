#include "model/gpt.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/profile.h"
#include "kernels/kernels.h"
#include "kernels/vocab_parallel.h"

namespace mt::model {

namespace {
Tensor acts(const Shape& s) { return Tensor::empty(s, DType::kF32, mem::Category::kActivations); }
Param* maybe(ParamStore& s, const std::string& name) {
  const Param* p = s.find(name);
  return const_cast<Param*>(p);
}
GptConfig with_tp_padding(GptConfig c, const parallel::tp::TpContext& tp) {
  if (tp.size > 1) c.vocab_pad_multiple = tp_vocab_pad(tp.size);
  return c;
}
std::vector<ParamSpec> rank_specs(const GptConfig& c, const parallel::tp::TpContext& tp) {
  c.validate();
  if (tp.size == 1) return gpt_param_specs(c);
  check_tp(c, tp.size, tp.sp);
  return tp_shard_specs(gpt_param_specs(c), tp.rank, tp.size);
}
}  // namespace

Gpt::Gpt(const GptConfig& config, uint64_t seed, StoreOptions store, parallel::tp::TpContext tp)
    : config_(with_tp_padding(config, tp)),
      params_(rank_specs(config_, tp), DType::kF32, store),
      tp_(tp) {
  config_.validate();
  params_.initialize(seed);
  const int64_t C = config_.d_model, F = config_.d_ff / tp.size, Cl = C / tp.size;
  wte_ = &params_.get("transformer.wte.weight");
  wpe_ = &params_.get("transformer.wpe.weight");
  lm_head_ = config_.tied ? wte_ : &params_.get("lm_head.weight");
  ln_f_ = {&params_.get("transformer.ln_f.weight"), maybe(params_, "transformer.ln_f.bias"), C};
  for (int l = 0; l < config_.n_layer; ++l) {
    const std::string h = "transformer.h." + std::to_string(l) + ".";
    Block b;
    b.n_head = config_.n_head;
    b.tp = tp_;
    b.ln_1 = {&params_.get(h + "ln_1.weight"), maybe(params_, h + "ln_1.bias"), C};
    b.c_attn = {&params_.get(h + "attn.c_attn.weight"), maybe(params_, h + "attn.c_attn.bias"), C,
                3 * Cl};
    b.attn_proj = {&params_.get(h + "attn.c_proj.weight"), maybe(params_, h + "attn.c_proj.bias"),
                   Cl, C};
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

std::vector<int> Gpt::sequence_parallel_params() const {
  std::vector<int> v;
  if (!tp_.sp) return v;
  auto add = [&](const Param* p) {
    if (p) v.push_back(static_cast<int>(p - params_.params().data()));
  };
  add(wpe_);
  for (const Block& b : blocks_) {
    add(b.ln_1.w);
    add(b.ln_1.b);
    add(b.ln_2.w);
    add(b.ln_2.b);
  }
  add(ln_f_.w);
  add(ln_f_.b);
  std::sort(v.begin(), v.end());
  return v;
}

Activations Gpt::make_activations(int64_t B, int64_t T) const {
  if (T > config_.seq_len)
    fail("sequence length {} is longer than the model's seq_len {} (use --seq {} or less)", T,
         config_.seq_len, config_.seq_len);
  if (tp_.sp && (B * T) % tp_.size != 0)
    fail("--sp: {} tokens per microbatch do not split over --tp {}", B * T, tp_.size);
  const int64_t N = B * T, C = config_.d_model, Nl = tp_.local_rows(N);
  Activations a;
  a.B = B;
  a.T = T;
  a.tokens.resize(N);
  a.targets.resize(N);
  a.encoded = acts({Nl, C});
  for (int l = 0; l < config_.n_layer; ++l)
    a.blocks.push_back(Block::make_activations(config_, B, T, tp_));
  a.lnf = acts({Nl, C});
  a.lnf_mean = acts({Nl});
  a.lnf_rstd = acts({Nl});
  a.logits = acts({N, config_.padded_vocab() / tp_.size});
  a.losses = acts({N});
  a.lse = acts({N});
  if (tp_.active()) {
    a.ce_max = acts({N});
    a.ce_sums = acts({2 * N});
    if (tp_.sp) a.lnf_full = acts({N, C});
  }
  return a;
}

float Gpt::forward(Activations& a, const int32_t* inputs, const int32_t* targets) {
  const int64_t B = a.B, T = a.T, N = B * T, C = config_.d_model;
  std::copy(inputs, inputs + N, a.tokens.begin());
  std::copy(targets, targets + N, a.targets.begin());
  if (tp_.active()) return forward_tp(a);
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
  scratch_ = Block::make_scratch(config_, B, T, tp_);
  dres_ = Tensor::empty({B * T, config_.d_model}, DType::kF32, mem::Category::kWorkspace);
  scratch_tokens_ = B * T;
}

void Gpt::backward(Activations& a, float dloss) {
  const int64_t B = a.B, T = a.T, N = B * T, C = config_.d_model;
  const int64_t Vp = config_.padded_vocab();
  if (tp_.active()) return backward_tp(a, dloss);
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

// ---- tensor parallelism -------------------------------------------------------------
// Vocabulary-parallel embedding and LM head (Megatron-LM): rank r owns rows [v0, v0 + Vl)
// of the padded vocabulary (Vl = Vp/t, v0 = r·Vl), of which the first `real` are real
// tokens. The embedding of a token another rank owns is 0 here; g (or ḡ with --sp) sums.
// The cross-entropy never gathers logits: row max -> all-reduce(max); sum of exp and the
// target's logit (owned by one rank, 0 elsewhere) -> one all-reduce(sum) of 2N floats.

float Gpt::forward_tp(Activations& a) {
  namespace tpo = parallel::tp;
  const int64_t B = a.B, T = a.T, N = B * T, C = config_.d_model;
  const int64_t Nl = tp_.local_rows(N), row0 = tp_.first_row(N);
  const int64_t Vl = config_.padded_vocab() / tp_.size, v0 = tp_.rank * Vl;
  const int64_t real = std::clamp<int64_t>(config_.vocab - v0, 0, Vl);
  for (int64_t i = 0; i < N; ++i)
    if (a.targets[i] < 0 || a.targets[i] >= config_.vocab)
      fail("cross_entropy: target {} of row {} is outside [0, {})", a.targets[i], i, config_.vocab);
  ensure_scratch(B, T);
  parallel::UnitHooks& hooks = hooks_ ? *hooks_ : no_hooks_;
  const int head = num_units() - 1;
  hooks.before_forward(0);
  {
    profile::Scope p("embedding.fwd");
    float* partial = tp_.sp ? scratch_.part.f32() : a.encoded.f32();
    kernels::vocab_parallel_embedding_forward(partial, a.tokens.data(), wte_->value.f32(), N, C, v0,
                                              Vl);
    if (tp_.sp)
      tpo::reduce_scatter_rows(tp_, partial, a.encoded.f32(), Nl * C);
    else
      tpo::all_reduce(tp_, a.encoded.f32(), N * C);
    kernels::add_position_embedding(a.encoded.f32(), wpe_->value.f32(), row0, Nl, T, C);
  }
  const float* x = a.encoded.f32();
  for (size_t l = 0; l < blocks_.size(); ++l) {
    hooks.before_forward(static_cast<int>(l) + 1);
    blocks_[l].forward(a.blocks[l], x, B, T, &scratch_);
    x = a.blocks[l].out.f32();
  }
  hooks.before_forward(head);
  ln_f_.forward(a.lnf.f32(), a.lnf_mean.f32(), a.lnf_rstd.f32(), x, Nl);
  const float* head_in = a.lnf.f32();
  if (tp_.sp) {
    tpo::all_gather_rows(tp_, a.lnf.f32(), a.lnf_full.f32(), Nl * C);
    head_in = a.lnf_full.f32();
  }
  {
    profile::Scope p("lm_head.fwd");
    kernels::linear_forward(a.logits.f32(), head_in, lm_head_->value.f32(), nullptr, N, C, Vl);
  }
  float* mx = a.ce_max.f32();
  float* sums = a.ce_sums.f32();
  {
    profile::Scope p("cross_entropy.fwd");
    kernels::vocab_parallel_max(mx, a.logits.f32(), N, Vl, real);
    tpo::all_reduce_max(tp_, mx, N);
    kernels::vocab_parallel_sum_exp(sums, sums + N, a.logits.f32(), mx, a.targets.data(), N, Vl,
                                    real, v0);
    tpo::all_reduce(tp_, sums, 2 * N);
  }
  double sum = 0;
  for (int64_t i = 0; i < N; ++i) {
    const float lse = mx[i] + std::log(sums[i]);
    a.lse.f32()[i] = lse;
    a.losses.f32()[i] = lse - sums[N + i];
    sum += a.losses.f32()[i];
  }
  return static_cast<float>(sum / static_cast<double>(N));
}

void Gpt::backward_tp(Activations& a, float dloss) {
  namespace tpo = parallel::tp;
  const int64_t B = a.B, T = a.T, N = B * T, C = config_.d_model;
  const int64_t Nl = tp_.local_rows(N), row0 = tp_.first_row(N);
  const int64_t Vl = config_.padded_vocab() / tp_.size, v0 = tp_.rank * Vl;
  const int64_t real = std::clamp<int64_t>(config_.vocab - v0, 0, Vl);
  ensure_scratch(B, T);
  parallel::UnitHooks& hooks = hooks_ ? *hooks_ : no_hooks_;
  const int head = num_units() - 1;
  hooks.before_backward(head);
  float* dlogits = a.logits.f32();  // in place
  {
    profile::Scope p("cross_entropy.bwd");
    kernels::vocab_parallel_ce_backward(dlogits, a.logits.f32(), a.lse.f32(), a.targets.data(),
                                        dloss, N, Vl, real, v0);
  }
  const float* head_in = tp_.sp ? a.lnf_full.f32() : a.lnf.f32();
  float* dlnf = scratch_.dln.f32();
  {
    profile::Scope p("lm_head.bwd");
    float* partial = tp_.sp ? scratch_.part.f32() : dlnf;  // f (f̄) backward of the head input
    kernels::linear_backward(partial, config_.tied ? nullptr : lm_head_->grad.f32(), nullptr,
                             dlogits, head_in, lm_head_->value.f32(), N, C, Vl);
    if (tp_.sp)
      tpo::reduce_scatter_rows(tp_, partial, dlnf, Nl * C);
    else
      tpo::all_reduce(tp_, dlnf, N * C);
  }
  float* dres = dres_.f32();
  dres_.zero_();
  const float* last = blocks_.empty() ? a.encoded.f32() : a.blocks.back().out.f32();
  ln_f_.backward(dres, dlnf, last, a.lnf_mean.f32(), a.lnf_rstd.f32(), Nl);
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
    kernels::position_embedding_backward(wpe_->grad.f32(), dres, row0, Nl, T, C);
    const float* d = dres;  // g backward: identity; ḡ backward: all-gather
    if (tp_.sp) {
      tpo::all_gather_rows(tp_, dres, scratch_.gath.f32(), Nl * C);
      d = scratch_.gath.f32();
    }
    kernels::vocab_parallel_embedding_backward(wte_->grad.f32(), d, a.tokens.data(), N, C, v0, Vl);
  }
  if (config_.tied) {
    profile::Scope p("lm_head.bwd");
    kernels::linear_backward(nullptr, wte_->grad.f32(), nullptr, dlogits, head_in,
                             wte_->value.f32(), N, C, Vl);
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

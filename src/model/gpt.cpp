#include "model/gpt.h"

#include <algorithm>
#include <cmath>

#include "core/device.h"
#include "core/error.h"
#include "core/profile.h"
#include "kernels/kernels.h"
#include "kernels/mixed.h"
#include "kernels/vocab_parallel.h"

namespace mt::model {

namespace {
constexpr int64_t kMixedHeadRows = 256;  // see ensure_scratch
Tensor acts(const Shape& s) { return Tensor::empty(s, DType::kF32, mem::Category::kActivations); }
// The batch's ids on the GPU (a copy from the host; nothing on the CPU).
void upload(const std::vector<int32_t>& host, Tensor& dev) {
  if (dev.defined())
    device::copy(dev.raw(), dev.device(), host.data(), mem::Device::kCpu, dev.bytes());
}
Param* maybe(ParamStore& s, const std::string& name) {
  const Param* p = s.find(name);
  return const_cast<Param*>(p);
}
GptConfig with_tp_padding(GptConfig c, const parallel::tp::TpContext& tp) {
  if (tp.size > 1) c.vocab_pad_multiple = tp_vocab_pad(tp.size);
  return c;
}
std::vector<ParamSpec> rank_specs(const GptConfig& c, const parallel::tp::TpContext& tp,
                                  const StageParts& parts, const parallel::ep::EpContext& ep) {
  c.validate();
  std::vector<ParamSpec> specs = stage_param_specs(c, parts);
  if (tp.size > 1) {
    check_tp(c, tp.size, tp.sp);
    specs = tp_shard_specs(std::move(specs), tp.rank, tp.size);
  }
  if (ep.size > 1) {
    if (!c.moe.enabled())
      fail(
          "--ep {}: model {} has no experts to split (expert parallelism needs an MoE model, "
          "e.g. --model mixtral-tiny, or --moe-experts N)",
          ep.size, c.name);
    specs = ep_shard_specs(std::move(specs), ep.rank, ep.size);
  }
  return specs;
}
}  // namespace

Recompute parse_recompute(const std::string& name) {
  if (name == "none") return Recompute::kNone;
  if (name == "selective") return Recompute::kSelective;
  if (name == "full") return Recompute::kFull;
  fail("unknown --recompute '{}' (choose none, selective or full)", name);
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
    default:
      return "none";
  }
}

std::vector<ParamSpec> stage_param_specs(const GptConfig& c, const StageParts& parts) {
  std::vector<bool> mine(static_cast<size_t>(c.n_layer), parts.all_layers);
  for (int l : parts.layers) {
    if (l < 0 || l >= c.n_layer) fail("stage layer {} is outside [0, {})", l, c.n_layer);
    mine[static_cast<size_t>(l)] = true;
  }
  std::vector<ParamSpec> out;
  std::vector<ParamSpec> tail;  // the last stage's tied wte copy, after the final norm
  for (const ParamSpec& s : gpt_param_specs(c)) {
    if (s.layer >= 0) {
      if (mine[static_cast<size_t>(s.layer)]) out.push_back(s);
    } else if (s.name == "transformer.wte.weight") {
      if (parts.embedding) {
        out.push_back(s);
        out.back().gemm_weight = c.tied && parts.head;  // the LM head reads it here too
      } else if (parts.head && c.tied)
        tail.push_back(s);
    } else if (s.name == "transformer.wpe.weight") {
      if (parts.embedding) out.push_back(s);
    } else if (parts.head) {
      out.push_back(s);  // final norm, untied lm_head
    }
  }
  out.insert(out.end(), tail.begin(), tail.end());
  return out;
}

Gpt::Gpt(const GptConfig& config, uint64_t seed, StoreOptions store, parallel::tp::TpContext tp,
         StageParts parts, parallel::ep::EpContext ep)
    : config_(with_tp_padding(config, tp)),
      parts_(std::move(parts)),
      params_(rank_specs(config_, tp, parts_, ep), DType::kF32, store),
      cp_(std::make_unique<parallel::cp::CpContext>()),
      tp_(tp),
      ep_(ep),
      moe_options_(std::make_unique<MoeOptions>()),
      moe_stats_(std::make_unique<std::vector<MoeStats>>()),
      moe_bias_(std::make_unique<std::vector<float>>(
          static_cast<size_t>(config.n_moe_layers() * config.moe.n_experts), 0.f)) {
  config_.validate();
  if (config_.moe.enabled() && device::on_cuda())
    fail("model {} has {} experts: MoE layers run on the CPU only so far (drop --device cuda)",
         config_.name, config_.moe.n_experts);
  params_.initialize(seed);  // by global name and element index: the same on any layout
  if (store.bf16_copy) mp_ = std::make_unique<MixedPrecision>();
  const int64_t C = config_.d_model, F = config_.d_ff / tp.size, Cl = C / tp.size;
  if (parts_.embedding || (parts_.head && config_.tied))
    wte_ = &params_.get("transformer.wte.weight");
  if (parts_.embedding && config_.positions == Positions::kLearned)
    wpe_ = &params_.get("transformer.wpe.weight");
  if (config_.positions == Positions::kRope)
    rope_ = std::make_unique<RopeTables>(make_rope_tables(config_, config_.seq_len));
  const bool rms = config_.norm == NormKind::kRmsNorm;
  auto norm = [&](const std::string& name) {
    return model::Norm{&params_.get(name + ".weight"), maybe(params_, name + ".bias"), C, rms,
                       config_.norm_eps};
  };
  if (parts_.head) {
    lm_head_ = config_.tied ? wte_ : &params_.get("lm_head.weight");
    ln_f_ = norm("transformer.ln_f");
  }
  moe_stats_->reserve(static_cast<size_t>(config_.n_layer));  // the layers point into it
  for (int l = 0; l < config_.n_layer; ++l) {
    const std::string h = "transformer.h." + std::to_string(l) + ".";
    if (!params_.find(h + "ln_1.weight")) continue;
    Block b;
    b.layer = l;
    b.n_head = config_.n_head;
    b.n_kv_head = config_.kv_heads();
    b.mlp = config_.mlp;
    b.rope = rope_.get();
    b.tp = tp_;
    b.cp = cp_.get();
    b.ln_1 = norm(h + "ln_1");
    b.c_attn = {&params_.get(h + "attn.c_attn.weight"), maybe(params_, h + "attn.c_attn.bias"), C,
                config_.qkv_dim() / tp.size};
    b.attn_proj = {&params_.get(h + "attn.c_proj.weight"), maybe(params_, h + "attn.c_proj.bias"),
                   Cl, C};
    b.ln_2 = norm(h + "ln_2");
    if (config_.moe.is_moe_layer(l)) {
      b.is_moe = true;
      MoeLayer& m = b.moe;
      m.router = &params_.get(h + "moe.router.weight");
      m.w_in = &params_.get(h + "moe.experts.c_fc.weight");
      m.b_in = maybe(params_, h + "moe.experts.c_fc.bias");
      m.w_out = &params_.get(h + "moe.experts.c_proj.weight");
      m.b_out = maybe(params_, h + "moe.experts.c_proj.bias");
      m.shared_in = maybe(params_, h + "moe.shared.c_fc.weight");
      m.shared_in_b = maybe(params_, h + "moe.shared.c_fc.bias");
      m.shared_out = maybe(params_, h + "moe.shared.c_proj.weight");
      m.shared_out_b = maybe(params_, h + "moe.shared.c_proj.bias");
      m.experts = config_.moe.n_experts;
      m.top_k = config_.moe.top_k;
      m.c = C;
      m.f = config_.expert_ff();
      m.f_shared = config_.moe.d_ff_shared;
      m.mlp = config_.mlp;
      m.order = config_.moe.order;
      m.mp = mp_.get();
      m.options = moe_options_.get();
      m.ep = ep_;
      m.cp = cp_.get();
      moe_stats_->push_back({});
      moe_stats_->back().reset(m.experts);
      m.stats = &moe_stats_->back();
      moe_layers_.push_back(l);
      b.c_attn.mp = b.attn_proj.mp = mp_.get();
      blocks_.push_back(b);
      continue;
    }
    b.c_fc = {&params_.get(h + "mlp.c_fc.weight"), maybe(params_, h + "mlp.c_fc.bias"), C,
              config_.fc_dim() / tp.size};
    b.mlp_proj = {&params_.get(h + "mlp.c_proj.weight"), maybe(params_, h + "mlp.c_proj.bias"), F,
                  C};
    for (Linear* l : {&b.c_attn, &b.attn_proj, &b.c_fc, &b.mlp_proj}) l->mp = mp_.get();
    blocks_.push_back(b);
  }
}

void Gpt::set_context_parallel(const parallel::cp::CpContext& cp) {
  parallel::cp::check_split(config_.seq_len, cp.size);
  *cp_ = cp;
  positions_.clear();
  if (!cp.active()) return;
  positions_ = cp.positions(config_.seq_len);
  if (rope_) *rope_ = make_rope_tables(config_, positions_);
  scratch_tokens_ = 0;  // the scratch gains the exchange buffers
}

std::vector<int> Gpt::unit_first_params() const {
  auto index_of = [&](const Param* p) { return static_cast<int>(p - params_.params().data()); };
  std::vector<int> v;
  if (parts_.embedding) v.push_back(index_of(wte_));
  for (const Block& b : blocks_) v.push_back(index_of(b.ln_1.w));
  if (parts_.head) v.push_back(index_of(ln_f_.w));
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
  if (parts_.head) {
    add(ln_f_.w);
    add(ln_f_.b);
  }
  std::sort(v.begin(), v.end());
  return v;
}

Activations Gpt::make_activations(int64_t B, int64_t T) const {
  return make_activations(B, T, num_blocks(), parts_.head, false);
}

Activations Gpt::make_activations(int64_t B, int64_t T, int n_blocks, bool with_head,
                                  bool split) const {
  if (T > config_.seq_len)
    fail("sequence length {} is longer than the model's seq_len {} (use --seq {} or less)", T,
         config_.seq_len, config_.seq_len);
  if (cp_->active() && T * cp_->size != config_.seq_len)
    fail(
        "context parallelism splits sequences of seq_len {}: activations for {} local rows x cp {}",
        config_.seq_len, T, cp_->size);
  if (tp_.sp && (B * T) % tp_.size != 0)
    fail("--sp: {} tokens per microbatch do not split over --tp {}", B * T, tp_.size);
  const int64_t N = B * T, C = config_.d_model, Nl = tp_.local_rows(N);
  Activations a;
  a.B = B;
  a.T = T;
  a.tokens.resize(N);
  a.targets.resize(N);
  if (device::on_cuda()) {
    a.tokens_dev = Tensor::empty({N}, DType::kI32, mem::Category::kActivations);
    a.targets_dev = Tensor::empty({N}, DType::kI32, mem::Category::kActivations);
  }
  a.encoded = acts({Nl, C});
  a.n_blocks = n_blocks;
  const Block::Keep keep = recompute_ == Recompute::kFull        ? Block::Keep::kOutputOnly
                           : recompute_ == Recompute::kSelective ? Block::Keep::kNoAttention
                                                                 : Block::Keep::kAll;
  // --moe-shadow: every MoE layer's shadow buffers with the rest (MoeLayer's shapes are the
  // same in every MoE block).
  const MoeLayer* moe = nullptr;
  for (const Block& b : blocks_)
    if (b.moe.router) moe = &b.moe;
  const auto with_shadows = [&](BlockActivations& b) {
    if (moe && moe_options_->shadow && ep_.active()) moe->make_shadow_activations(b.moe);
  };
  if (keep == Block::Keep::kOutputOnly && !recomputed_.att.defined()) {
    recomputed_ = Block::make_activations(config_, B, T, tp_, Block::Keep::kAll, ep_.size,
                                          mp_ != nullptr, mixed_attention());
    with_shadows(recomputed_);
  }
  if (keep == Block::Keep::kNoAttention && !recomputed_.att.defined())
    recomputed_.att = acts({kernels::attention_stash_elems(B, config_.n_head / tp_.size, T)});
  if (keep != Block::Keep::kAll &&
      recomputed_.att.numel() != kernels::attention_stash_elems(B, config_.n_head / tp_.size, T))
    fail("activations for microbatches of {} x {} after others: recomputation shares one set", B,
         T);
  for (int l = 0; l < n_blocks; ++l) {
    BlockActivations b = Block::make_activations(config_, B, T, tp_, keep, ep_.size, mp_ != nullptr,
                                                 mixed_attention());
    if (keep == Block::Keep::kNoAttention) b.att = recomputed_.att;
    if (keep == Block::Keep::kOutputOnly) {
      Tensor out = b.out;
      b = recomputed_;
      b.out = out;
    }
    with_shadows(b);
    a.blocks.push_back(std::move(b));
    if (split) a.stash.push_back(Block::make_stash(config_, B, T, tp_));
  }
  if (!with_head) return a;
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

bool Gpt::mixed_attention() const {
  return mp_ && !device::on_cuda() && !kernels::fused_attention() && !cp_->active();
}

void Gpt::ensure_scratch(int64_t B, int64_t T) {
  if (B * T == scratch_tokens_ && scratch_.datt.defined() &&
      scratch_.datt.numel() == kernels::attention_scratch_elems(B, config_.n_head / tp_.size, T))
    return;
  scratch_ = Block::make_scratch(config_, B, T, tp_, *cp_, ep_.size);
  dres_ = Tensor::empty({B * T, config_.d_model}, DType::kF32, mem::Category::kWorkspace);
  scratch_tokens_ = B * T;
  if (mp_) {  // bf16: the largest GEMM input (C or F/t wide) and output gradient
    const int64_t N = B * T, C = config_.d_model;
    // An MoE layer's GEMMs: an expert's rows (at most N: top-k experts are distinct) of
    // width C or its F, and the shared expert's N rows.
    const MoeConfig& moe = config_.moe;
    const int64_t Fe = moe.enabled() ? std::max(config_.expert_ff(), moe.d_ff_shared) : 0;
    const int64_t F = std::max(config_.d_ff / tp_.size, Fe);
    const int64_t FCe = config_.mlp == MlpKind::kSwiGlu ? 2 * Fe : Fe;
    const int64_t widest =
        std::max({config_.qkv_dim() / tp_.size, C, config_.fc_dim() / tp_.size, FCe});
    // With ep an expert's rows come from every ep rank: up to ep·N.
    const int64_t Ne = N * ep_.size;
    mp_->x = Tensor::empty({std::max(N * std::max(C, F), Ne * std::max(C, Fe))}, DType::kBF16,
                           mem::Category::kWorkspace);
    // The LM head's [N, Vp/t] output gradient goes through it in chunks of at least
    // kMixedHeadRows rows: each chunk reads and writes the whole f32 d(wte), so tiny chunks
    // (N·widest / Vp rows: 62 for Model M) made its backward slower than f32.
    const int64_t head = std::min(N, kMixedHeadRows) * (config_.padded_vocab() / tp_.size);
    mp_->dy = Tensor::empty({std::max({N * widest, Ne * std::max(C, FCe), head})}, DType::kBF16,
                            mem::Category::kWorkspace);
    // The CPU's T × T attention kernel reads q, k, v (all heads) and dO rounded; q, k, v only
    // where the blocks keep qkv in f32 (Block::qkv_fits_bf16: RoPE or repeated kv heads).
    mp_->attn = Tensor();
    const int64_t parts = Block::qkv_fits_bf16(config_) ? 1 : 4;
    if (mixed_attention())
      mp_->attn = Tensor::empty({N * parts * (config_.n_head / tp_.size) * config_.head_dim()},
                                DType::kBF16, mem::Category::kWorkspace);
  }
}

float Gpt::forward(Activations& a, const int32_t* inputs, const int32_t* targets) {
  if (!parts_.embedding || !parts_.head || num_blocks() != config_.n_layer)
    fail("Gpt::forward runs the whole model; a pipeline stage runs the pieces");
  set_batch(a, inputs, targets);
  embed_forward(a);
  blocks_forward(a, 0, num_blocks());
  return head_forward(a);
}

void Gpt::backward(Activations& a, float dloss) {
  ensure_scratch(a.B, a.T);
  a.dloss = dloss;
  float* dres = dres_.f32();
  head_backward(a, dloss, dres, BackwardPart::kAll);
  blocks_backward(a, 0, num_blocks(), dres, BackwardPart::kAll);
  embed_backward(a, dres);
}

void Gpt::set_batch(Activations& a, const int32_t* inputs, const int32_t* targets) const {
  const int64_t N = a.B * a.T;
  std::copy(inputs, inputs + N, a.tokens.begin());
  std::copy(targets, targets + N, a.targets.begin());
}

// ---- the pieces ---------------------------------------------------------------------
// With tensor parallelism (Megatron-LM) the embedding and LM head are vocabulary-parallel:
// rank r owns rows [v0, v0 + Vl) of the padded vocabulary (Vl = Vp/t, v0 = r·Vl), of which
// the first `real` are real tokens. The embedding of a token another rank owns is 0 here;
// g (or ḡ with --sp) sums. The cross-entropy never gathers logits: row max ->
// all-reduce(max); sum of exp and the target's logit (owned by one rank, 0 elsewhere) ->
// one all-reduce(sum) of 2N floats.

void Gpt::embed_forward(Activations& a) {
  namespace tpo = parallel::tp;
  const int64_t B = a.B, T = a.T, N = B * T, C = config_.d_model;
  hooks().before_forward(0);
  upload(a.tokens, a.tokens_dev);
  profile::Scope p("embedding.fwd");
  const bool split = cp_->active();  // positions follow the cp split
  if (!tp_.active()) {
    kernels::embedding_forward(a.encoded.f32(), a.token_ids(), wte_->value.f32(),
                               wpe_ && !split ? wpe_->value.f32() : nullptr, B, T, C);
    if (wpe_ && split)
      kernels::add_position_rows(a.encoded.f32(), wpe_->value.f32(), positions_.data(), 0, N, T, C);
    return;
  }
  ensure_scratch(B, T);
  const int64_t Nl = tp_.local_rows(N), row0 = tp_.first_row(N);
  const int64_t Vl = config_.padded_vocab() / tp_.size, v0 = tp_.rank * Vl;
  float* partial = tp_.sp ? scratch_.part.f32() : a.encoded.f32();
  kernels::vocab_parallel_embedding_forward(partial, a.token_ids(), wte_->value.f32(), N, C, v0,
                                            Vl);
  if (tp_.sp)
    tpo::reduce_scatter_rows(tp_, partial, a.encoded.f32(), Nl * C);
  else
    tpo::all_reduce(tp_, a.encoded.f32(), N * C);
  if (wpe_ && split)
    kernels::add_position_rows(a.encoded.f32(), wpe_->value.f32(), positions_.data(), row0, Nl, T,
                               C);
  else if (wpe_)
    kernels::add_position_embedding(a.encoded.f32(), wpe_->value.f32(), row0, Nl, T, C);
}

void Gpt::set_moe_options(const MoeOptions& o) {
  *moe_options_ = o;
  int slot = 0;  // the global MoE layer index of each of the model's MoE layers
  std::vector<int> slot_of(static_cast<size_t>(config_.n_layer), -1);
  for (int l = 0; l < config_.n_layer; ++l)
    if (config_.moe.is_moe_layer(l)) slot_of[static_cast<size_t>(l)] = slot++;
  for (Block& b : blocks_)
    if (b.is_moe)
      b.moe.selection_bias =
          o.balance_bias
              ? moe_bias_->data() + static_cast<size_t>(slot_of[static_cast<size_t>(b.layer)] *
                                                        config_.moe.n_experts)
              : nullptr;
}

void Gpt::set_replay(BlockActivations& b, const Activations& a, int k) const {
  const Block& blk = blocks_[static_cast<size_t>(k)];
  if (!blk.is_moe) return;
  b.moe.replay = {tape_, tape_record_, a.routing_sample, blk.layer, a.T};
}

void Gpt::blocks_forward(Activations& a, int k0, int n) {
  ensure_scratch(a.B, a.T);
  a.n_blocks = n;
  const float* x = a.encoded.f32();
  for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
    const int k = k0 + static_cast<int>(i);
    hooks().before_forward(block_unit(k));
    set_replay(a.blocks[i], a, k);
    blocks_[static_cast<size_t>(k)].forward(a.blocks[i], x, a.B, a.T, &scratch_);
    x = a.blocks[i].out.f32();
  }
}

float Gpt::head_forward(Activations& a) {
  namespace tpo = parallel::tp;
  const int64_t N = a.B * a.T, C = config_.d_model, Nl = tp_.local_rows(N);
  for (int64_t i = 0; i < N; ++i)
    if (a.targets[i] < 0 || a.targets[i] >= config_.vocab)
      fail("cross_entropy: target {} of row {} is outside [0, {})", a.targets[i], i, config_.vocab);
  hooks().before_forward(head_unit());
  upload(a.targets, a.targets_dev);
  ensure_scratch(a.B, a.T);  // bf16: the GEMM workspaces
  ln_f_.forward(a.lnf.f32(), a.lnf_mean.f32(), a.lnf_rstd.f32(), chunk_output(a), Nl);
  if (tp_.sp) tpo::all_gather_rows(tp_, a.lnf.f32(), a.lnf_full.f32(), Nl * C);
  const int64_t Vl = config_.padded_vocab() / tp_.size;
  {
    profile::Scope p("lm_head.fwd");
    gemm_forward(mp_.get(), a.logits.f32(), head_input(a), *lm_head_, nullptr, N, C, Vl);
  }
  double sum = 0;
  if (!tp_.active()) {
    {
      profile::Scope p("cross_entropy.fwd");
      kernels::cross_entropy_forward(a.losses.f32(), a.lse.f32(), a.logits.f32(), a.target_ids(), N,
                                     config_.vocab, Vl);
    }
    sum = kernels::sum(a.losses.f32(), N);  // in order, in double
    return static_cast<float>(sum / static_cast<double>(N));
  }
  const int64_t v0 = tp_.rank * Vl, real = std::clamp<int64_t>(config_.vocab - v0, 0, Vl);
  float* mx = a.ce_max.f32();
  float* sums = a.ce_sums.f32();
  {
    profile::Scope p("cross_entropy.fwd");
    kernels::vocab_parallel_max(mx, a.logits.f32(), N, Vl, real);
    tpo::all_reduce_max(tp_, mx, N);
    kernels::vocab_parallel_sum_exp(sums, sums + N, a.logits.f32(), mx, a.target_ids(), N, Vl, real,
                                    v0);
    tpo::all_reduce(tp_, sums, 2 * N);
  }
  kernels::vocab_parallel_lse(a.lse.f32(), a.losses.f32(), mx, sums, N);
  sum = kernels::sum(a.losses.f32(), N);
  return static_cast<float>(sum / static_cast<double>(N));
}

void Gpt::head_backward(Activations& a, float dloss, float* dres, BackwardPart part) {
  namespace tpo = parallel::tp;
  const int64_t B = a.B, T = a.T, N = B * T, C = config_.d_model, Nl = tp_.local_rows(N);
  const int64_t Vl = config_.padded_vocab() / tp_.size;
  ensure_scratch(B, T);
  hooks().before_backward(head_unit());
  float* dlogits = a.logits.f32();  // in place
  {
    profile::Scope p("cross_entropy.bwd");
    // This rank's vocabulary slice: columns [v0, v0 + real) are real tokens, the rest padding.
    const int64_t v0 = tp_.active() ? tp_.rank * Vl : 0;
    const int64_t real = std::clamp<int64_t>(config_.vocab - v0, 0, Vl);
    if (bf16_head_grad())  // rounded where it is computed (kernels/mixed.h)
      kernels::ce_backward_bf16_in_place(dlogits, a.lse.f32(), a.target_ids(), dloss, N, Vl, real,
                                         v0);
    else if (!tp_.active())
      kernels::cross_entropy_backward(dlogits, a.logits.f32(), a.lse.f32(), a.target_ids(), dloss,
                                      N, config_.vocab, Vl);
    else
      kernels::vocab_parallel_ce_backward(dlogits, a.logits.f32(), a.lse.f32(), a.target_ids(),
                                          dloss, N, Vl, real, v0);
  }
  float* dlnf = scratch_.dln.f32();
  {
    profile::Scope p("lm_head.bwd");
    // The weight gradient now unless it waits: for the embedding (tied, same stage: see
    // backward) or for W (zero-bubble).
    const bool weight = part == BackwardPart::kAll && !defer_head_weight();
    float* partial = tp_.sp ? scratch_.part.f32() : dlnf;  // f (f̄) backward of the head input
    head_gemms_backward(a, partial, weight ? lm_head_->grad.f32() : nullptr);
    if (tp_.sp)
      tpo::reduce_scatter_rows(tp_, partial, dlnf, Nl * C);
    else
      tpo::all_reduce(tp_, dlnf, N * C);
  }
  device::zero(dres, device::current(), Nl * C * static_cast<int64_t>(sizeof(float)));
  ln_f_.backward(dres, dlnf, chunk_output(a), a.lnf_mean.f32(), a.lnf_rstd.f32(), Nl);
  hooks().after_backward(head_unit());
}

void Gpt::blocks_backward(Activations& a, int k0, int n, float* dres, BackwardPart part) {
  ensure_scratch(a.B, a.T);
  for (int i = n - 1; i >= 0; --i) {
    const int k = k0 + i;
    const Block& b = blocks_[static_cast<size_t>(k)];
    const float* x = i == 0 ? a.encoded.f32() : a.blocks[static_cast<size_t>(i) - 1].out.f32();
    const size_t si = static_cast<size_t>(i);
    if (part == BackwardPart::kWeight) {
      b.backward_weight(scratch_, a.blocks[si], a.stash[si], a.B, a.T);
      continue;
    }
    hooks().before_backward(block_unit(k));
    // The balancing losses are means over the microbatch's tokens, weighed like its loss.
    // With cp the losses are the whole microbatch's: its B·T tokens over all cp pieces.
    a.blocks[si].moe_loss_weight = a.dloss * static_cast<float>(a.B * a.T * cp_->size);
    if (recompute_ == Recompute::kFull) {  // the block's forward again, into the shared set
      profile::Scope p("recompute.fwd");
      set_replay(a.blocks[si], a, k);
      b.forward(a.blocks[si], x, a.B, a.T, &scratch_);
    } else if (recompute_ == Recompute::kSelective) {
      b.recompute_attention(a.blocks[si], a.B, a.T, scratch_);
    }
    if (part == BackwardPart::kAll)
      b.backward(dres, scratch_, a.blocks[si], x, a.B, a.T);
    else
      b.backward_input(dres, scratch_, a.blocks[si], x, a.stash[si], a.B, a.T);
    hooks().after_backward(block_unit(k));
  }
}

void Gpt::embed_backward(Activations& a, const float* dres) {
  namespace tpo = parallel::tp;
  const int64_t B = a.B, T = a.T, N = B * T, C = config_.d_model;
  hooks().before_backward(0);
  {
    profile::Scope p("embedding.bwd");
    const bool split = cp_->active();
    if (!tp_.active()) {
      kernels::embedding_backward(wte_->grad.f32(), wpe_ && !split ? wpe_->grad.f32() : nullptr,
                                  dres, a.token_ids(), B, T, C);
      if (wpe_ && split)
        kernels::position_rows_backward(wpe_->grad.f32(), dres, positions_.data(), 0, N, T, C);
    } else {
      const int64_t Nl = tp_.local_rows(N), row0 = tp_.first_row(N);
      const int64_t Vl = config_.padded_vocab() / tp_.size, v0 = tp_.rank * Vl;
      ensure_scratch(B, T);
      if (wpe_ && split)
        kernels::position_rows_backward(wpe_->grad.f32(), dres, positions_.data(), row0, Nl, T, C);
      else if (wpe_)
        kernels::position_embedding_backward(wpe_->grad.f32(), dres, row0, Nl, T, C);
      const float* d = dres;  // g backward: identity; ḡ backward: all-gather
      if (tp_.sp) {
        tpo::all_gather_rows(tp_, dres, scratch_.gath.f32(), Nl * C);
        d = scratch_.gath.f32();
      }
      kernels::vocab_parallel_embedding_backward(wte_->grad.f32(), d, a.token_ids(), N, C, v0, Vl);
    }
  }
  // Tied, same stage: d(wte) += d(logits)^T · lnf, the LM head's share, kept until now
  // (dlogits and lnf are still in the activations).
  if (defer_head_weight()) head_weight_backward(a);
  hooks().after_backward(0);
}

void Gpt::head_weight_backward(Activations& a) {
  profile::Scope p("lm_head.bwd");
  head_gemms_backward(a, nullptr, lm_head_->grad.f32());
}

void Gpt::head_gemms_backward(Activations& a, float* dx, float* dw) {
  const int64_t N = a.B * a.T, C = config_.d_model, Vl = config_.padded_vocab() / tp_.size;
  if (bf16_head_grad())  // the bf16 output gradient over the logits (head_backward)
    gemm_backward(mp_.get(), dx, dw, reinterpret_cast<const bf16*>(a.logits.f32()), 2 * Vl,
                  head_input(a), *lm_head_, N, C, Vl);
  else
    gemm_backward(mp_.get(), dx, dw, nullptr, a.logits.f32(), head_input(a), *lm_head_, N, C, Vl);
}

double training_flops_per_token(const GptConfig& c, int64_t T) {
  const double L = c.n_layer, C = c.d_model, F = c.d_ff, Vp = c.padded_vocab();
  // q|k|v, the attention's output projection, the MLP's first (gate|up with SwiGLU) and
  // second projections, and the LM head. An MoE block's MLP is what a token passes through:
  // the router, its top-k experts and the shared expert (the active parameters).
  const double mlp_mats = c.mlp == MlpKind::kSwiGlu ? 3.0 : 2.0;
  const double Lm = static_cast<double>(c.n_moe_layers());
  const double moe_mlp =
      static_cast<double>(c.moe.n_experts) * C +
      static_cast<double>(c.moe.top_k) * mlp_mats * C * static_cast<double>(c.expert_ff()) +
      mlp_mats * C * static_cast<double>(c.moe.d_ff_shared);
  const double matmul_params = L * (double(c.qkv_dim()) * C + C * C) +
                               (L - Lm) * (double(c.fc_dim()) * C + F * C) + Lm * moe_mlp + Vp * C;
  // 2 FLOPs per multiply-add, x3 for forward + backward; attention scores and the
  // weighted sum (2 * 2 * T * C per token per layer forward) counted over the full T x T as
  // Megatron-LM and PaLM count them.
  return 6.0 * matmul_params + 12.0 * L * C * static_cast<double>(T);
}

}  // namespace mt::model

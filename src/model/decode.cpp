#include "model/decode.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/kernels.h"

namespace mt::model {

namespace {
Tensor buffer(const Shape& s) { return Tensor::empty(s, DType::kF32, mem::Category::kActivations); }
}  // namespace

Decoder::Decoder(const Gpt& gpt, int64_t max_len) : gpt_(gpt), max_len_(max_len) {
  const GptConfig& c = gpt.config();
  const StageParts& parts = gpt.parts();
  if (gpt.tp().active() || !parts.all_layers || !parts.embedding || !parts.head)
    fail("Decoder needs the whole model on one rank (no tensor or pipeline parallelism)");
  if (gpt.num_blocks() > 0 && gpt.block(0).c_attn.mp)
    fail("Decoder runs f32 GEMMs: build the model without a bf16 copy (StoreOptions::bf16_copy)");
  if (max_len < 1 || max_len > c.seq_len)
    fail(
        "generation needs {} positions; the model has seq_len={} (ask for fewer tokens or a "
        "shorter prompt)",
        max_len, c.seq_len);
  const int64_t C = c.d_model, hd = C / c.n_head, kv = c.kv_heads() * hd;
  x_ = buffer({C});
  ln_ = buffer({C});
  qkv_ = buffer({c.qkv_dim()});
  atty_ = buffer({C});
  branch_ = buffer({C});
  fch_ = buffer({c.fc_dim()});
  act_ = buffer({c.d_ff});
  logits_ = buffer({c.padded_vocab()});
  scores_ = buffer({c.n_head * max_len});
  if (c.moe.enabled()) {
    moe_ = MoeLayer::make_activations(c, 1);
    moe_scratch_ = MoeLayer::make_scratch(c, 1);
  }
  for (int l = 0; l < gpt.num_blocks(); ++l) {
    k_cache_.push_back(buffer({max_len, kv}));
    v_cache_.push_back(buffer({max_len, kv}));
  }
}

const float* Decoder::step(int32_t token) {
  const GptConfig& c = gpt_.config();
  if (token < 0 || token >= c.vocab)
    fail("token {} is outside the vocabulary [0, {})", token, c.vocab);
  if (pos_ >= max_len_)
    fail("the cache holds {} positions and all are used (make the Decoder longer)", max_len_);
  const int64_t C = c.d_model, heads = c.n_head, kvh = c.kv_heads(), hd = C / heads;
  const int64_t kv = kvh * hd, p = pos_;
  float *x = x_.f32(), *ln = ln_.f32(), *qkv = qkv_.f32(), *branch = branch_.f32();
  float mean = 0, rstd = 0;
  // Embedding: wte[token] (+ wpe[p]); embedding_forward of one row with the table offset.
  const Param* wpe = gpt_.wpe();
  kernels::embedding_forward(x, &token, gpt_.wte()->value.f32(),
                             wpe ? wpe->value.f32() + p * C : nullptr, 1, 1, C);
  for (int l = 0; l < gpt_.num_blocks(); ++l) {
    const Block& b = gpt_.block(l);
    b.ln_1.forward(ln, &mean, &rstd, x, 1);
    b.c_attn.forward(qkv, ln, 1);
    if (b.rope) {  // the tables' row p: rope_forward of one position reads row 0
      const int64_t half = hd / 2;
      const float *cs = b.rope->cos.f32() + p * half, *sn = b.rope->sin.f32() + p * half;
      kernels::rope_forward(qkv, 1, 1, b.c_attn.out, 0, heads, hd, cs, sn);
      kernels::rope_forward(qkv, 1, 1, b.c_attn.out, heads * hd, kvh, hd, cs, sn);
    }
    float *kc = k_cache_[static_cast<size_t>(l)].f32(),
          *vc = v_cache_[static_cast<size_t>(l)].f32();
    std::copy(qkv + C, qkv + C + kv, kc + p * kv);
    std::copy(qkv + C + kv, qkv + C + 2 * kv, vc + p * kv);
    kernels::attention_decode(atty_.f32(), scores_.f32(), qkv, kc, vc, p + 1, heads, kvh, hd);
    b.attn_proj.forward(branch, atty_.f32(), 1);
    kernels::accumulate(x, branch, C);
    b.ln_2.forward(ln, &mean, &rstd, x, 1);
    if (b.is_moe) {  // the token's top-k experts (no capacity: one token never overflows)
      b.moe.forward(moe_, branch, ln, 1, moe_scratch_);
      kernels::accumulate(x, branch, C);
      continue;
    }
    b.c_fc.forward(fch_.f32(), ln, 1);
    if (b.mlp == MlpKind::kSwiGlu)
      kernels::swiglu_forward(act_.f32(), fch_.f32(), 1, c.d_ff);
    else
      kernels::gelu_forward(act_.f32(), fch_.f32(), c.d_ff);
    b.mlp_proj.forward(branch, act_.f32(), 1);
    kernels::accumulate(x, branch, C);
  }
  gpt_.final_norm().forward(ln, &mean, &rstd, x, 1);
  kernels::linear_forward(logits_.f32(), ln, gpt_.lm_head()->value.f32(), nullptr, 1, C,
                          c.padded_vocab());
  ++pos_;
  return logits_.f32();
}

}  // namespace mt::model

#include "model/layers.h"

#include "core/profile.h"
#include "kernels/kernels.h"

namespace mt::model {

namespace {
float* grad_of(Param* p) { return p ? p->grad.f32() : nullptr; }
const float* value_of(Param* p) { return p ? p->value.f32() : nullptr; }
Tensor acts(const Shape& s) { return Tensor::empty(s, DType::kF32, mem::Category::kActivations); }
Tensor scratch(const Shape& s) { return Tensor::empty(s, DType::kF32, mem::Category::kWorkspace); }
}  // namespace

void LayerNorm::forward(float* y, float* mean, float* rstd, const float* x, int64_t n) const {
  profile::Scope p("layernorm.fwd");
  kernels::layernorm_forward(y, mean, rstd, x, w->value.f32(), value_of(b), n, c);
}

void LayerNorm::backward(float* dx, const float* dy, const float* x, const float* mean,
                         const float* rstd, int64_t n) const {
  profile::Scope p("layernorm.bwd");
  kernels::layernorm_backward(dx, w->grad.f32(), grad_of(b), dy, x, w->value.f32(), mean, rstd,
                              n, c);
}

void Linear::forward(float* y, const float* x, int64_t n) const {
  profile::Scope p("linear.fwd");
  kernels::linear_forward(y, x, w->value.f32(), value_of(b), n, in, out);
}

void Linear::backward(float* dx, const float* dy, const float* x, int64_t n) const {
  profile::Scope p("linear.bwd");
  kernels::linear_backward(dx, w->grad.f32(), grad_of(b), dy, x, w->value.f32(), n, in, out);
}

BlockActivations Block::make_activations(const GptConfig& c, int64_t B, int64_t T) {
  const int64_t N = B * T, C = c.d_model, F = c.d_ff;
  BlockActivations a;
  a.ln1 = acts({N, C});
  a.ln1_mean = acts({N});
  a.ln1_rstd = acts({N});
  a.qkv = acts({N, 3 * C});
  a.att = acts({B, c.n_head, T, T});
  a.atty = acts({N, C});
  a.res2 = acts({N, C});
  a.ln2 = acts({N, C});
  a.ln2_mean = acts({N});
  a.ln2_rstd = acts({N});
  a.fch = acts({N, F});
  a.fch_gelu = acts({N, F});
  a.out = acts({N, C});
  return a;
}

BlockScratch Block::make_scratch(const GptConfig& c, int64_t B, int64_t T) {
  const int64_t N = B * T, C = c.d_model, F = c.d_ff;
  return BlockScratch{scratch({N, C}),  scratch({N, C}),  scratch({N, 3 * C}),
                      scratch({N, F}),  scratch({N, F}),  scratch({B, c.n_head, T, T})};
}

void Block::forward(BlockActivations& a, const float* x, int64_t B, int64_t T) const {
  const int64_t N = B * T, C = ln_1.c;
  // Attention branch: res2 = x + c_proj(attention(c_attn(ln_1(x))))
  ln_1.forward(a.ln1.f32(), a.ln1_mean.f32(), a.ln1_rstd.f32(), x, N);
  c_attn.forward(a.qkv.f32(), a.ln1.f32(), N);
  {
    profile::Scope p("attention.fwd");
    kernels::attention_forward(a.atty.f32(), a.att.f32(), a.qkv.f32(), B, T, C, n_head);
  }
  attn_proj.forward(a.res2.f32(), a.atty.f32(), N);
  kernels::add(a.res2.f32(), a.res2.f32(), x, N * C);
  // MLP branch: out = res2 + c_proj(gelu(c_fc(ln_2(res2))))
  ln_2.forward(a.ln2.f32(), a.ln2_mean.f32(), a.ln2_rstd.f32(), a.res2.f32(), N);
  c_fc.forward(a.fch.f32(), a.ln2.f32(), N);
  {
    profile::Scope p("gelu.fwd");
    kernels::gelu_forward(a.fch_gelu.f32(), a.fch.f32(), a.fch.numel());
  }
  mlp_proj.forward(a.out.f32(), a.fch_gelu.f32(), N);
  kernels::add(a.out.f32(), a.out.f32(), a.res2.f32(), N * C);
}

void Block::backward(float* dres, BlockScratch& s, const BlockActivations& a, const float* x,
                     int64_t B, int64_t T) const {
  const int64_t N = B * T, C = ln_1.c;
  // MLP branch. dres = d(out) = d(res2) through the residual; add the branch's share.
  mlp_proj.backward(s.dgelu.f32(), dres, a.fch_gelu.f32(), N);
  {
    profile::Scope p("gelu.bwd");
    kernels::gelu_backward(s.dfch.f32(), a.fch.f32(), s.dgelu.f32(), a.fch.numel());
  }
  c_fc.backward(s.dln.f32(), s.dfch.f32(), a.ln2.f32(), N);
  ln_2.backward(dres, s.dln.f32(), a.res2.f32(), a.ln2_mean.f32(), a.ln2_rstd.f32(), N);
  // Attention branch. dres now = d(res2) = d(x) through the residual.
  attn_proj.backward(s.datty.f32(), dres, a.atty.f32(), N);
  {
    profile::Scope p("attention.bwd");
    kernels::attention_backward(s.dqkv.f32(), s.datt.f32(), s.datty.f32(), a.qkv.f32(),
                                a.att.f32(), B, T, C, n_head);
  }
  c_attn.backward(s.dln.f32(), s.dqkv.f32(), a.ln1.f32(), N);
  ln_1.backward(dres, s.dln.f32(), x, a.ln1_mean.f32(), a.ln1_rstd.f32(), N);
}

}  // namespace mt::model

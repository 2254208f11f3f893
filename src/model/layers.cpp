#include "model/layers.h"

#include "core/device.h"
#include "core/error.h"
#include "core/profile.h"
#include "kernels/flash_attention.h"
#include "kernels/kernels.h"
#include "kernels/mixed.h"
#include "kernels/vocab_parallel.h"

namespace mt::model {

namespace {
float* grad_of(Param* p) { return p ? p->grad.f32() : nullptr; }
const float* value_of(Param* p) { return p ? p->value.f32() : nullptr; }
Tensor acts(const Shape& s, DType t = DType::kF32) {
  return Tensor::empty(s, t, mem::Category::kActivations);
}
Tensor scratch(const Shape& s) { return Tensor::empty(s, DType::kF32, mem::Category::kWorkspace); }
}  // namespace

void Norm::forward(float* y, float* mean, float* rstd, const float* x, int64_t n) const {
  profile::Scope p("layernorm.fwd");
  if (rms)
    kernels::rmsnorm_forward(y, rstd, x, w->value.f32(), n, c, eps);
  else
    kernels::layernorm_forward(y, mean, rstd, x, w->value.f32(), value_of(b), n, c);
}

void Norm::forward(const Tensor& y, float* mean, float* rstd, const float* x, int64_t n) const {
  if (y.dtype() != DType::kBF16) return forward(y.f32(), mean, rstd, x, n);
  profile::Scope p("layernorm.fwd");
  if (rms)
    kernels::rmsnorm_forward(y.bf16p(), rstd, x, w->value.f32(), n, c, eps);
  else
    kernels::layernorm_forward(y.bf16p(), mean, rstd, x, w->value.f32(), value_of(b), n, c);
}

void Norm::backward(float* dx, const float* dy, const float* x, const float* mean,
                    const float* rstd, int64_t n) const {
  profile::Scope p("layernorm.bwd");
  if (rms)
    kernels::rmsnorm_backward(dx, w->grad.f32(), dy, x, w->value.f32(), rstd, n, c);
  else
    kernels::layernorm_backward(dx, w->grad.f32(), grad_of(b), dy, x, w->value.f32(), mean, rstd, n,
                                c);
}

GemmIn GemmIn::of(const Tensor& t) {
  if (!t.defined()) return nullptr;
  if (t.dtype() == DType::kBF16) return t.bf16p();
  return t.f32();
}

namespace {
// x as a bf16 GEMM operand of `elems` elements: a bf16 activation as it is, an f32 one
// rounded into mp's workspace.
const bf16* bf16_operand(const MixedPrecision& mp, GemmIn x, int64_t elems) {
  MT_ASSERT(x.defined());
  if (x.h) return x.h;
  MT_ASSERT(mp.x.numel() >= elems);
  profile::Scope p("bf16.convert");  // an f32 activation a GEMM reads, rounded each time
  kernels::to_bf16(mp.x.bf16p(), x.f, elems);
  return mp.x.bf16p();
}
}  // namespace

void gemm_forward(const MixedPrecision* mp, float* y, GemmIn x, const float* w, const bf16* wb,
                  const float* b, int64_t n, int64_t in, int64_t out, const float* residual) {
  if (!mp) {
    MT_ASSERT(x.f);  // bf16 activations exist only with --dtype bf16
    kernels::linear_forward(y, x.f, w, b, n, in, out);
  } else {
    MT_ASSERT(wb);
    const bf16* xb = bf16_operand(*mp, x, n * in);
    if (residual && !device::on_cuda())  // added in the GEMM's epilogue
      return kernels::linear_forward_mixed_residual(y, xb, wb, b, residual, n, in, out);
    kernels::linear_forward_mixed(y, xb, wb, b, n, in, out);
  }
  if (residual) kernels::add(y, y, residual, n * out);
}

void gemm_backward(const MixedPrecision* mp, float* dx, float* dw, float* db, const float* dy,
                   GemmIn x, const float* w, const bf16* wb, int64_t n, int64_t in, int64_t out) {
  if (!mp) {
    MT_ASSERT(!x.h);
    kernels::linear_backward(dx, dw, db, dy, x.f, w, n, in, out);
    return;
  }
  MT_ASSERT(wb);
  const bf16* xb = dw ? bf16_operand(*mp, x, n * in) : nullptr;  // x only for dw
  kernels::linear_backward_mixed(dx, dw, db, dy, xb, wb, n, in, out, mp->dy.bf16p(),
                                 mp->dy.numel());
}

void gemm_forward(const MixedPrecision* mp, float* y, GemmIn x, const Param& w, const float* b,
                  int64_t n, int64_t in, int64_t out, const float* residual) {
  // With bf16 only the bf16 copy is read (ZeRO-3 may hold no f32 value here).
  if (mp) MT_ASSERT(w.value_bf16.defined());
  gemm_forward(mp, y, x, mp ? nullptr : w.value.f32(), mp ? w.value_bf16.bf16p() : nullptr, b, n,
               in, out, residual);
}

void gemm_forward(const MixedPrecision* mp, bf16* y, GemmIn x, const Param& w, const float* b,
                  int64_t n, int64_t in, int64_t out) {
  MT_ASSERT(mp && w.value_bf16.defined());
  kernels::linear_forward_mixed(y, bf16_operand(*mp, x, n * in), w.value_bf16.bf16p(), b, n, in,
                                out);
}

void gemm_backward(const MixedPrecision* mp, float* dx, float* dw, float* db, const float* dy,
                   GemmIn x, const Param& w, int64_t n, int64_t in, int64_t out) {
  if (mp) MT_ASSERT(w.value_bf16.defined());
  gemm_backward(mp, dx, dw, db, dy, x, mp ? nullptr : w.value.f32(),
                mp ? w.value_bf16.bf16p() : nullptr, n, in, out);
}

void gemm_backward(const MixedPrecision* mp, float* dx, float* dw, const bf16* dy, int64_t ldy,
                   GemmIn x, const Param& w, int64_t n, int64_t in, int64_t out) {
  MT_ASSERT(mp && w.value_bf16.defined());
  const bf16* xb = dw ? bf16_operand(*mp, x, n * in) : nullptr;
  kernels::linear_backward_mixed(dx, dw, dy, ldy, xb, w.value_bf16.bf16p(), n, in, out,
                                 kernels::linear_backward_mixed_chunk_cols(n, out, mp->dy.numel()));
}

void Linear::forward(float* y, GemmIn x, int64_t n, const float* residual) const {
  profile::Scope p("linear.fwd");
  gemm_forward(mp, y, x, *w, value_of(b), n, in, out, residual);
}

void Linear::forward(const Tensor& y, GemmIn x, int64_t n) const {
  if (y.dtype() != DType::kBF16) return forward(y.f32(), x, n);
  profile::Scope p("linear.fwd");
  gemm_forward(mp, y.bf16p(), x, *w, value_of(b), n, in, out);
}

void Linear::backward(float* dx, const float* dy, GemmIn x, int64_t n) const {
  profile::Scope p("linear.bwd");
  gemm_backward(mp, dx, w->grad.f32(), grad_of(b), dy, x, *w, n, in, out);
}

BlockActivations Block::make_activations(const GptConfig& c, int64_t B, int64_t T,
                                         const parallel::tp::TpContext& tp, Keep keep, int ep,
                                         bool bf16_inputs, bool bf16_attention) {
  const int64_t N = B * T, C = c.d_model, F = c.d_ff / tp.size, Cl = C / tp.size;
  const int64_t QKVl = c.qkv_dim() / tp.size, FCl = c.fc_dim() / tp.size;
  const int64_t Nl = tp.local_rows(N);  // rows of the residual / layer-norm region
  BlockActivations a;
  a.out = acts({Nl, C});
  if (keep == Keep::kOutputOnly) return a;
  // The GEMM-only activations (layers.h BlockActivations); an MoE router reads ln2 in f32.
  const DType gemm_in = bf16_inputs ? DType::kBF16 : DType::kF32;
  a.ln1 = acts({Nl, C}, gemm_in);
  a.ln1_mean = acts({Nl});
  a.ln1_rstd = acts({Nl});
  const bool bf16_qkv = bf16_inputs && bf16_attention && qkv_fits_bf16(c);
  a.qkv = acts({N, QKVl}, bf16_qkv ? DType::kBF16 : DType::kF32);
  if (keep == Keep::kAll) a.att = acts({kernels::attention_stash_elems(B, c.n_head / tp.size, T)});
  a.atty = acts({N, Cl}, bf16_inputs && bf16_attention ? DType::kBF16 : DType::kF32);
  a.res2 = acts({Nl, C});
  a.ln2 = acts({Nl, C}, c.moe.enabled() ? DType::kF32 : gemm_in);
  a.ln2_mean = acts({Nl});
  a.ln2_rstd = acts({Nl});
  if (c.n_moe_layers() < c.n_layer) {  // dense blocks
    a.fch = acts({N, FCl});
    a.fch_gelu = acts({N, F}, gemm_in);
  }
  if (c.moe.enabled()) a.moe = MoeLayer::make_activations(c, N, ep);
  return a;
}

void Block::recompute_attention(BlockActivations& a, int64_t B, int64_t T, BlockScratch& s) const {
  // Writes atty again too: the same values (the kernel is deterministic). qkv is kept
  // rotated, so RoPE is not applied again.
  attend(a, B, T, s, "attention.recompute");
}

BlockScratch Block::make_scratch(const GptConfig& c, int64_t B, int64_t T,
                                 const parallel::tp::TpContext& tp,
                                 const parallel::cp::CpContext& cp, int ep) {
  const int64_t N = B * T, C = c.d_model, F = c.d_ff / tp.size, Cl = C / tp.size;
  const int64_t QKVl = c.qkv_dim() / tp.size, FCl = c.fc_dim() / tp.size;
  BlockScratch s{
      scratch({N, C}),    scratch({N, Cl}),
      scratch({N, QKVl}), scratch({N, FCl}),
      scratch({N, F}),    scratch({kernels::attention_scratch_elems(B, c.n_head / tp.size, T)}),
      Tensor(),           Tensor(),
      Tensor(),           Tensor(),
      Tensor(),           Tensor(),
      Tensor(),           Tensor(),
      Tensor(),           Tensor(),
      MoeScratch{}};
  if (c.moe.enabled()) s.moe = MoeLayer::make_scratch(c, N, ep);
  if (c.kv_heads() != c.n_head) {
    s.qkvx = scratch({N, 3 * Cl});
    s.dqkvx = scratch({N, 3 * Cl});
  }
  if (tp.active() && tp.sp) {
    s.gath = scratch({N, C});
    s.part = scratch({N, C});
  }
  if (cp.active()) {
    const parallel::cp::AttentionShape sh{
        B, T * cp.size, c.n_head / tp.size, c.kv_heads() / tp.size, c.head_dim(), 0, 0};
    const parallel::cp::WorkspaceElems e = parallel::cp::workspace_elems(cp, sh);
    s.cp_local = scratch({e.local});
    s.cp_ranked = scratch({e.ranked});
    s.cp_kv = scratch({e.kv});
    s.cp_dkv = scratch({e.dkv});
    s.cp_o = scratch({e.o});
    s.cp_lse = scratch({e.lse});
  }
  return s;
}

parallel::cp::AttentionShape Block::cp_shape(int64_t B, int64_t T) const {
  const int64_t heads = n_head / tp.size, kvh = n_kv_head / tp.size, hd = ln_1.c / n_head;
  return {B, T * cp->size, heads, kvh, hd, c_attn.out, heads * hd};
}

namespace {
parallel::cp::Workspace cp_workspace(BlockScratch& s) {
  return {s.cp_local.f32(), s.cp_ranked.f32(), s.cp_kv.f32(),
          s.cp_dkv.f32(),   s.cp_o.f32(),      s.cp_lse.f32()};
}
}  // namespace

void Block::rotate_qkv(float* qkv, int64_t B, int64_t T, bool backward) const {
  if (!rope) return;
  profile::Scope p(backward ? "rope.bwd" : "rope.fwd");
  const int64_t heads = n_head / tp.size, kvh = n_kv_head / tp.size, hd = ln_1.c / n_head;
  const int64_t stride = c_attn.out;  // this rank's q | k | v columns
  const float *cs = rope->cos.f32(), *sn = rope->sin.f32();
  auto rot = backward ? kernels::rope_backward : kernels::rope_forward;
  rot(qkv, B, T, stride, 0, heads, hd, cs, sn);         // q
  rot(qkv, B, T, stride, heads * hd, kvh, hd, cs, sn);  // k
}

void Block::attend(BlockActivations& a, int64_t B, int64_t T, BlockScratch& s,
                   const char* scope) const {
  profile::Scope p(scope);
  if (context_parallel()) {  // the keys and values of the whole sequence, over cp
    parallel::cp::attention_forward(*cp, cp_shape(B, T), a.qkv.f32(), a.atty.f32(), a.att.f32(),
                                    cp_workspace(s));
    return;
  }
  const int64_t heads = n_head / tp.size, kvh = n_kv_head / tp.size, hd = ln_1.c / n_head;
  // qkv kept in bf16 for the attention's GEMMs (make_activations: no RoPE, no kv heads to
  // repeat), or f32, rounded here where the T × T kernel runs on bf16 operands.
  const bf16* qkv_b = a.qkv.dtype() == DType::kBF16 ? a.qkv.bf16p() : nullptr;
  const float* qkv = nullptr;
  if (!qkv_b) {
    qkv = a.qkv.f32();
    if (kvh != heads) {
      kernels::expand_kv_heads(s.qkvx.f32(), qkv, B * T, heads, kvh, hd);
      qkv = s.qkvx.f32();
    }
    qkv_b = rounded_for_attention(qkv, B * T * 3 * heads * hd);
  }
  if (!qkv_b)
    kernels::attention_forward(a.atty.f32(), a.att.f32(), qkv, B, T, heads * hd, heads);
  else if (a.atty.dtype() == DType::kBF16)
    kernels::attention_forward_mixed(a.atty.bf16p(), a.att.f32(), qkv_b, B, T, heads * hd, heads);
  else
    kernels::attention_forward_mixed(a.atty.f32(), a.att.f32(), qkv_b, B, T, heads * hd, heads);
}

const bf16* Block::rounded_for_attention(const float* x, int64_t elems, int64_t at) const {
  const MixedPrecision* mp = c_attn.mp;  // the model's (every linear of a block has it)
  if (!mp || !mp->attn.defined() || kernels::fused_attention()) return nullptr;
  MT_ASSERT(at + elems <= mp->attn.numel());
  profile::Scope p("bf16.convert");
  bf16* y = mp->attn.bf16p() + at;
  kernels::to_bf16(y, x, elems);
  return y;
}

void Block::attend_backward(float* dqkv, BlockScratch& s, const BlockActivations& a, int64_t B,
                            int64_t T) const {
  profile::Scope p("attention.bwd");
  if (context_parallel()) {
    parallel::cp::attention_backward(*cp, cp_shape(B, T), a.qkv.f32(), a.atty.f32(), a.att.f32(),
                                     s.datty.f32(), dqkv, cp_workspace(s));
    rotate_qkv(dqkv, B, T, true);
    return;
  }
  const int64_t heads = n_head / tp.size, kvh = n_kv_head / tp.size, hd = ln_1.c / n_head;
  const int64_t qkv_elems = B * T * 3 * heads * hd;
  // As attend: qkv kept in bf16 (then no kv heads to reduce, no RoPE), or f32.
  const bf16* qkv_b = a.qkv.dtype() == DType::kBF16 ? a.qkv.bf16p() : nullptr;
  const float* qkv = nullptr;
  float* dfull = dqkv;
  if (!qkv_b) {
    qkv = a.qkv.f32();
    if (kvh != heads) {  // the repeated kv heads again (not kept), and their gradient apart
      kernels::expand_kv_heads(s.qkvx.f32(), qkv, B * T, heads, kvh, hd);
      qkv = s.qkvx.f32();
      dfull = s.dqkvx.f32();
    }
    qkv_b = rounded_for_attention(qkv, qkv_elems);
  }
  if (!device::on_cuda() && kernels::fused_attention())  // the blockwise CPU kernel
    kernels::flash_attention_backward(dfull, s.datty.f32(), qkv, a.atty.f32(), a.att.f32(), B, T,
                                      heads * hd, heads);
  else if (qkv_b)  // --dtype bf16: bf16 GEMM operands
    kernels::attention_backward_mixed(
        dfull, s.datt.f32(),
        rounded_for_attention(s.datty.f32(), B * T * heads * hd, qkv ? qkv_elems : 0), qkv_b,
        a.att.f32(), B, T, heads * hd, heads);
  else
    kernels::attention_backward(dfull, s.datt.f32(), s.datty.f32(), qkv, a.att.f32(), B, T,
                                heads * hd, heads);
  if (dfull != dqkv) kernels::reduce_kv_heads(dqkv, dfull, B * T, heads, kvh, hd);
  rotate_qkv(dqkv, B, T, true);
}

void Block::activation_forward(BlockActivations& a) const {
  profile::Scope p(mlp == MlpKind::kSwiGlu ? "swiglu.fwd" : "gelu.fwd");
  const int64_t n = a.fch_gelu.shape()[0], f = a.fch_gelu.shape()[1];
  auto run = [&](auto* y) {  // f32, or bf16 (a GEMM input)
    if (mlp == MlpKind::kSwiGlu)
      kernels::swiglu_forward(y, a.fch.f32(), n, f);
    else
      kernels::gelu_forward(y, a.fch.f32(), a.fch.numel());
  };
  if (a.fch_gelu.dtype() == DType::kBF16)
    run(a.fch_gelu.bf16p());
  else
    run(a.fch_gelu.f32());
}

void Block::activation_backward(float* dfch, const float* dy, const BlockActivations& a) const {
  profile::Scope p(mlp == MlpKind::kSwiGlu ? "swiglu.bwd" : "gelu.bwd");
  if (mlp == MlpKind::kSwiGlu)
    kernels::swiglu_backward(dfch, a.fch.f32(), dy, a.fch_gelu.shape()[0], a.fch_gelu.shape()[1]);
  else
    kernels::gelu_backward(dfch, a.fch.f32(), dy, a.fch.numel());
}

void Block::forward(BlockActivations& a, const float* x, int64_t B, int64_t T,
                    BlockScratch* s) const {
  if (tp.active()) {
    if (!s) fail("Block::forward with tensor parallelism needs the scratch buffers");
    forward_tp(a, x, B, T, *s);
    return;
  }
  const int64_t N = B * T, C = ln_1.c;
  // Attention branch: res2 = x + c_proj(attention(c_attn(ln_1(x))))
  if (!s) fail("Block::forward needs the scratch buffers");
  ln_1.forward(a.ln1, a.ln1_mean.f32(), a.ln1_rstd.f32(), x, N);
  c_attn.forward(a.qkv, GemmIn::of(a.ln1), N);
  if (a.qkv.dtype() != DType::kBF16) rotate_qkv(a.qkv.f32(), B, T, false);
  attend(a, B, T, *s);
  attn_proj.forward(a.res2.f32(), GemmIn::of(a.atty), N, x);
  // MLP branch: out = res2 + c_proj(gelu(c_fc(ln_2(res2))))
  ln_2.forward(a.ln2, a.ln2_mean.f32(), a.ln2_rstd.f32(), a.res2.f32(), N);
  if (is_moe) {
    moe.forward(a.moe, a.out.f32(), a.ln2.f32(), N, s->moe);
    kernels::add(a.out.f32(), a.out.f32(), a.res2.f32(), N * C);
  } else {
    c_fc.forward(a.fch.f32(), GemmIn::of(a.ln2), N);
    activation_forward(a);
    mlp_proj.forward(a.out.f32(), GemmIn::of(a.fch_gelu), N, a.res2.f32());
  }
}

void Block::backward(float* dres, BlockScratch& s, const BlockActivations& a, const float* x,
                     int64_t B, int64_t T) const {
  if (tp.active()) {
    backward_tp(dres, s, a, x, B, T);
    return;
  }
  const int64_t N = B * T;
  // MLP branch. dres = d(out) = d(res2) through the residual; add the branch's share.
  if (is_moe) {
    moe.backward(s.dln.f32(), dres, a.ln2.f32(), N, a.moe, s.moe, a.moe_loss_weight);
  } else {
    mlp_proj.backward(s.dgelu.f32(), dres, GemmIn::of(a.fch_gelu), N);
    activation_backward(s.dfch.f32(), s.dgelu.f32(), a);
    c_fc.backward(s.dln.f32(), s.dfch.f32(), GemmIn::of(a.ln2), N);
  }
  ln_2.backward(dres, s.dln.f32(), a.res2.f32(), a.ln2_mean.f32(), a.ln2_rstd.f32(), N);
  // Attention branch. dres now = d(res2) = d(x) through the residual.
  attn_proj.backward(s.datty.f32(), dres, GemmIn::of(a.atty), N);
  attend_backward(s.dqkv.f32(), s, a, B, T);
  c_attn.backward(s.dln.f32(), s.dqkv.f32(), GemmIn::of(a.ln1), N);
  ln_1.backward(dres, s.dln.f32(), x, a.ln1_mean.f32(), a.ln1_rstd.f32(), N);
}

// ---- tensor parallelism ---------------------------------------------------------------
// Below, N = B·T tokens, Nl = N (N/t with --sp) the rows of the residual region, and every
// column-parallel GEMM runs on all N rows: its input is the f (f̄) of the layer-norm output.

GemmIn Block::all_rows(const Tensor& ln_out, BlockScratch& s) const {
  namespace tpo = parallel::tp;
  if (!tp.active() || !tp.sp) return GemmIn::of(ln_out);
  const int64_t elems = ln_out.numel();
  if (ln_out.dtype() == DType::kBF16) {  // half the bytes of the f32 rows: s.gath holds them
    bf16* full = static_cast<bf16*>(s.gath.raw());
    tpo::all_gather_rows(tp, ln_out.bf16p(), full, elems);
    return full;
  }
  tpo::all_gather_rows(tp, ln_out.f32(), s.gath.f32(), elems);
  return s.gath.f32();
}

void Block::row_parallel_forward(const Linear& l, float* y, GemmIn x, const float* residual,
                                 int64_t N, BlockScratch& s) const {
  namespace tpo = parallel::tp;
  const int64_t C = ln_1.c, Nl = tp.local_rows(N);
  float* partial = tp.sp ? s.part.f32() : y;
  {
    profile::Scope p("linear.fwd");
    gemm_forward(l.mp, partial, x, *l.w, nullptr, N, l.in, l.out);
  }
  if (tp.sp)
    tpo::reduce_scatter_rows(tp, partial, y, Nl * C);  // ḡ
  else
    tpo::all_reduce(tp, y, N * C);  // g
  if (l.b) kernels::add_bias(y, l.b->value.f32(), Nl, C);
  kernels::add(y, y, residual, Nl * C);
}

void Block::forward_tp(BlockActivations& a, const float* x, int64_t B, int64_t T,
                       BlockScratch& s) const {
  namespace tpo = parallel::tp;
  const int64_t N = B * T, Nl = tp.local_rows(N);
  // Attention branch.
  ln_1.forward(a.ln1, a.ln1_mean.f32(), a.ln1_rstd.f32(), x, Nl);
  c_attn.forward(a.qkv, all_rows(a.ln1, s), N);  // f: identity; f̄: all-gather the rows
  if (a.qkv.dtype() != DType::kBF16) rotate_qkv(a.qkv.f32(), B, T, false);
  attend(a, B, T, s);
  row_parallel_forward(attn_proj, a.res2.f32(), GemmIn::of(a.atty), x, N, s);
  // MLP branch.
  ln_2.forward(a.ln2, a.ln2_mean.f32(), a.ln2_rstd.f32(), a.res2.f32(), Nl);
  const GemmIn in2 = all_rows(a.ln2, s);
  if (is_moe) {
    moe_forward_tp(a, in2.f, N, s);  // ln2 is f32 in a model with MoE layers
    return;
  }
  c_fc.forward(a.fch.f32(), in2, N);
  activation_forward(a);
  row_parallel_forward(mlp_proj, a.out.f32(), GemmIn::of(a.fch_gelu), a.res2.f32(), N, s);
}

void Block::moe_forward_tp(BlockActivations& a, const float* in2, int64_t N,
                           BlockScratch& s) const {
  // Every tp rank runs the experts on all N rows (the same numbers on each); with --sp it
  // keeps its own rows of the output.
  const int64_t C = ln_1.c, Nl = tp.local_rows(N), row0 = tp.first_row(N);
  float* y = tp.sp ? s.part.f32() : a.out.f32();
  moe.forward(a.moe, y, in2, N, s.moe);
  kernels::add(a.out.f32(), y + row0 * C, a.res2.f32(), Nl * C);
}

void Block::moe_backward(float* dres, BlockScratch& s, const BlockActivations& a, int64_t N) const {
  namespace tpo = parallel::tp;
  const int64_t C = ln_1.c, Nl = tp.local_rows(N), row0 = tp.first_row(N);
  const bool sp = tp.active() && tp.sp;
  const float* dy = dres;
  const float* in2 = a.ln2.f32();
  if (sp) {  // the whole microbatch's output gradient and ln_2 output, gathered
    tpo::all_gather_rows(tp, dres, s.gath.f32(), Nl * C);
    tpo::all_gather_rows(tp, a.ln2.f32(), s.part.f32(), Nl * C);
    dy = s.gath.f32();
    in2 = s.part.f32();
  }
  moe.backward(s.dln.f32(), dy, in2, N, a.moe, s.moe, a.moe_loss_weight);
  ln_2.backward(dres, s.dln.f32() + row0 * C, a.res2.f32(), a.ln2_mean.f32(), a.ln2_rstd.f32(), Nl);
}

void Block::backward_tp(float* dres, BlockScratch& s, const BlockActivations& a, const float* x,
                        int64_t B, int64_t T) const {
  namespace tpo = parallel::tp;
  const int64_t N = B * T, C = ln_1.c, Nl = tp.local_rows(N);
  // The row-parallel layer's output gradient: g backward is the identity (every rank holds
  // the same dres); ḡ backward all-gathers it. Its bias gradient then sums all N rows, the
  // same on every rank. The column-parallel input gradient is a partial sum: f backward
  // all-reduces it, f̄ backward reduce-scatters it to this rank's rows.
  auto gathered = [&](const float* local) {
    if (!tp.sp) return local;
    tpo::all_gather_rows(tp, local, s.gath.f32(), Nl * C);
    return static_cast<const float*>(s.gath.f32());
  };
  auto column_input_grad = [&](const Linear& l, const float* dy, const Tensor& ln_out) {
    const GemmIn in = all_rows(ln_out, s);  // --sp: the layer-norm output again (not stored)
    float* dx = tp.sp ? s.part.f32() : s.dln.f32();
    l.backward(dx, dy, in, N);
    if (tp.sp)
      tpo::reduce_scatter_rows(tp, dx, s.dln.f32(), Nl * C);
    else
      tpo::all_reduce(tp, dx, N * C);
  };
  // MLP branch.
  if (is_moe) {
    moe_backward(dres, s, a, N);
  } else {
    mlp_proj.backward(s.dgelu.f32(), gathered(dres), GemmIn::of(a.fch_gelu), N);
    activation_backward(s.dfch.f32(), s.dgelu.f32(), a);
    column_input_grad(c_fc, s.dfch.f32(), a.ln2);
    ln_2.backward(dres, s.dln.f32(), a.res2.f32(), a.ln2_mean.f32(), a.ln2_rstd.f32(), Nl);
  }
  // Attention branch.
  attn_proj.backward(s.datty.f32(), gathered(dres), GemmIn::of(a.atty), N);
  attend_backward(s.dqkv.f32(), s, a, B, T);
  column_input_grad(c_attn, s.dqkv.f32(), a.ln1);
  ln_1.backward(dres, s.dln.f32(), x, a.ln1_mean.f32(), a.ln1_rstd.f32(), Nl);
}

// ---- zero-bubble split backward ---------------------------------------------------------
// Block::backward / backward_tp with the four weight-gradient GEMMs taken out. With t = 1
// every tp helper below is the identity (no communication).

BlockGradStash Block::make_stash(const GptConfig& c, int64_t B, int64_t T,
                                 const parallel::tp::TpContext& tp) {
  const int64_t N = B * T, C = c.d_model;
  return {acts({N, c.qkv_dim() / tp.size}), acts({N, C}), acts({N, c.fc_dim() / tp.size}),
          acts({N, C})};
}

void Block::backward_input(float* dres, BlockScratch& s, const BlockActivations& a, const float* x,
                           BlockGradStash& st, int64_t B, int64_t T) const {
  namespace tpo = parallel::tp;
  profile::Scope p("block.bwd_input");
  const int64_t N = B * T, C = ln_1.c, Nl = tp.local_rows(N);
  const int64_t Cl = C / tp.size, F = is_moe ? 0 : mlp_proj.in;
  const bool sp = tp.active() && tp.sp;
  // The row-parallel output gradient, whole (ḡ backward gathers it with --sp).
  auto stash_output_grad = [&](float* dst) {
    tpo::all_gather_rows(sp ? tp : tpo::TpContext{}, dres, dst, Nl * C);
  };
  // d(input) of a column-parallel layer: partial sums over tp, reduced into s.dln.
  auto column_input_grad = [&](const Linear& l, const float* dy) {
    float* dx = sp ? s.part.f32() : s.dln.f32();
    gemm_backward(l.mp, dx, nullptr, nullptr, dy, nullptr, *l.w, N, l.in, l.out);
    if (sp)
      tpo::reduce_scatter_rows(tp, dx, s.dln.f32(), Nl * C);
    else
      tpo::all_reduce(tp, dx, N * C);
  };
  // MLP branch. An MoE layer's backward runs whole here, its weight gradients included (the
  // W pass then has only the attention's): the same gradients, computed earlier.
  if (is_moe) {
    moe_backward(dres, s, a, N);
  } else {
    stash_output_grad(st.dmlp.f32());
    gemm_backward(mlp_proj.mp, s.dgelu.f32(), nullptr, nullptr, st.dmlp.f32(), nullptr, *mlp_proj.w,
                  N, F, C);
    activation_backward(st.dfch.f32(), s.dgelu.f32(), a);
    column_input_grad(c_fc, st.dfch.f32());
    ln_2.backward(dres, s.dln.f32(), a.res2.f32(), a.ln2_mean.f32(), a.ln2_rstd.f32(), Nl);
  }
  // Attention branch.
  stash_output_grad(st.dproj.f32());
  gemm_backward(attn_proj.mp, s.datty.f32(), nullptr, nullptr, st.dproj.f32(), nullptr,
                *attn_proj.w, N, Cl, C);
  attend_backward(st.dqkv.f32(), s, a, B, T);
  column_input_grad(c_attn, st.dqkv.f32());
  ln_1.backward(dres, s.dln.f32(), x, a.ln1_mean.f32(), a.ln1_rstd.f32(), Nl);
}

void Block::backward_weight(BlockScratch& s, const BlockActivations& a, const BlockGradStash& st,
                            int64_t B, int64_t T) const {
  profile::Scope p("block.bwd_weight");
  const int64_t N = B * T;
  auto weight_grad = [&](const Linear& l, const float* dy, GemmIn in) {
    gemm_backward(l.mp, nullptr, l.w->grad.f32(), grad_of(l.b), dy, in, *l.w, N, l.in, l.out);
  };
  // With --sp the layer-norm outputs are gathered again (all_rows).
  if (!is_moe) {
    weight_grad(mlp_proj, st.dmlp.f32(), GemmIn::of(a.fch_gelu));
    weight_grad(c_fc, st.dfch.f32(), all_rows(a.ln2, s));
  }
  weight_grad(attn_proj, st.dproj.f32(), GemmIn::of(a.atty));
  weight_grad(c_attn, st.dqkv.f32(), all_rows(a.ln1, s));
}

}  // namespace mt::model

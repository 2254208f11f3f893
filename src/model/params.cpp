#include "model/params.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "core/philox.h"
#include "core/profile.h"
#include "kernels/kernels.h"
#include "kernels/mixed.h"

namespace mt::model {

void ParamStore::zero_grads() {
  if (flat_grads_.numel() == 0) return;
  if (flat_grads_.device() == mem::Device::kCpu)
    kernels::zero(flat_grads_.f32(), flat_grads_.numel());
  else
    flat_grads_.zero_();
}

std::vector<ParamSpec> gpt_param_specs(const GptConfig& c) {
  const int64_t d = c.d_model, f = c.d_ff, vp = c.padded_vocab(), kv = c.kv_dim();
  const bool swiglu = c.mlp == MlpKind::kSwiGlu;
  constexpr float kStd = 0.02f;  // GPT-2
  // GPT-2 scales the residual output projections by 1/sqrt(2 * n_layer).
  const float residual_std = kStd / std::sqrt(2.0f * static_cast<float>(c.n_layer));
  std::vector<ParamSpec> s;
  auto add = [&](std::string name, Shape shape, Init init, float std, TpSplit split, int layer,
                 bool transposed = false) {
    ParamSpec p;
    p.name = std::move(name);
    p.weight_decay = shape.size() == 2;
    p.shape = std::move(shape);
    p.init = init;
    p.init_std = std;
    p.tp_split = split;
    p.layer = layer;
    p.hf_transposed = transposed && !c.llama_family();  // HF Llama's Linear is [out, in]
    s.push_back(std::move(p));
  };
  // An MoE block's mixture of experts (model/moe.h): the router [E, C], each expert's c_fc
  // and c_proj stacked over the experts ([E, FC, C], [E, C, F]: an expert-parallel rank
  // holds a range of whole experts), and the shared expert's c_fc and c_proj.
  auto add_moe = [&](const std::string& h, int l) {
    const int64_t E = c.moe.n_experts, F = c.expert_ff(), FC = swiglu ? 2 * F : F;
    add(h + "moe.router.weight", {E, d}, Init::kNormal, kStd, TpSplit::kReplicated, l);
    add(h + "moe.experts.c_fc.weight", {E, FC, d}, Init::kNormal, kStd, TpSplit::kReplicated, l);
    s.back().weight_decay = true;
    s.back().gemm_weight = true;
    if (c.bias) {
      add(h + "moe.experts.c_fc.bias", {E, FC}, Init::kZeros, 0, TpSplit::kReplicated, l);
      s.back().weight_decay = false;  // a bias, though two-dimensional
    }
    add(h + "moe.experts.c_proj.weight", {E, d, F}, Init::kNormal, residual_std,
        TpSplit::kReplicated, l);
    s.back().weight_decay = true;
    s.back().gemm_weight = true;
    if (c.bias) {
      add(h + "moe.experts.c_proj.bias", {E, d}, Init::kZeros, 0, TpSplit::kReplicated, l);
      s.back().weight_decay = false;
    }
    if (c.moe.d_ff_shared > 0) {
      const int64_t Fs = c.moe.d_ff_shared, FCs = swiglu ? 2 * Fs : Fs;
      add(h + "moe.shared.c_fc.weight", {FCs, d}, Init::kNormal, kStd, TpSplit::kReplicated, l);
      if (c.bias) add(h + "moe.shared.c_fc.bias", {FCs}, Init::kZeros, 0, TpSplit::kReplicated, l);
      add(h + "moe.shared.c_proj.weight", {d, Fs}, Init::kNormal, residual_std,
          TpSplit::kReplicated, l);
      if (c.bias) add(h + "moe.shared.c_proj.bias", {d}, Init::kZeros, 0, TpSplit::kReplicated, l);
    }
  };
  add("transformer.wte.weight", {vp, d}, Init::kNormal, kStd, TpSplit::kRows, -1);
  s.back().real_rows = c.vocab;
  s.back().gemm_weight = c.tied;  // the LM head
  if (c.positions == Positions::kLearned)
    add("transformer.wpe.weight", {c.seq_len, d}, Init::kNormal, kStd, TpSplit::kReplicated, -1);
  // The norms' bias exists with LayerNorm and biases; RMSNorm has none.
  const bool norm_bias = c.bias && c.norm == NormKind::kLayerNorm;
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string h = "transformer.h." + std::to_string(l) + ".";
    add(h + "ln_1.weight", {d}, Init::kOnes, 0, TpSplit::kReplicated, l);
    if (norm_bias) add(h + "ln_1.bias", {d}, Init::kZeros, 0, TpSplit::kReplicated, l);
    // q | k | v in one projection (Hugging Face Llama's q_proj, k_proj, v_proj stacked).
    add(h + "attn.c_attn.weight", {d + 2 * kv, d}, Init::kNormal, kStd, TpSplit::kBlockRows, l,
        true);
    s.back().row_blocks = {d, kv, kv};
    if (c.bias) {
      add(h + "attn.c_attn.bias", {d + 2 * kv}, Init::kZeros, 0, TpSplit::kBlockRows, l);
      s.back().row_blocks = {d, kv, kv};
    }
    add(h + "attn.c_proj.weight", {d, d}, Init::kNormal, residual_std, TpSplit::kCols, l, true);
    if (c.bias) add(h + "attn.c_proj.bias", {d}, Init::kZeros, 0, TpSplit::kReplicated, l);
    add(h + "ln_2.weight", {d}, Init::kOnes, 0, TpSplit::kReplicated, l);
    if (norm_bias) add(h + "ln_2.bias", {d}, Init::kZeros, 0, TpSplit::kReplicated, l);
    if (c.moe.is_moe_layer(l)) {
      const size_t first = s.size();
      add_moe(h, l);
      for (size_t i = first; i < s.size(); ++i)
        s[i].expert = s[i].name.find(".moe.experts.") != std::string::npos;
      continue;
    }
    // GELU: c_fc [F, C]; SwiGLU: gate | up stacked [2F, C] (gate_proj, up_proj), each half
    // split over tp alone so that a rank holds matching gate and up rows.
    const TpSplit fc_split = swiglu ? TpSplit::kBlockRows : TpSplit::kRows;
    const std::vector<int64_t> fc_blocks =
        swiglu ? std::vector<int64_t>{f, f} : std::vector<int64_t>{};
    add(h + "mlp.c_fc.weight", {c.fc_dim(), d}, Init::kNormal, kStd, fc_split, l, true);
    s.back().row_blocks = fc_blocks;
    if (c.bias) {
      add(h + "mlp.c_fc.bias", {c.fc_dim()}, Init::kZeros, 0, fc_split, l);
      s.back().row_blocks = fc_blocks;
    }
    add(h + "mlp.c_proj.weight", {d, f}, Init::kNormal, residual_std, TpSplit::kCols, l, true);
    if (c.bias) add(h + "mlp.c_proj.bias", {d}, Init::kZeros, 0, TpSplit::kReplicated, l);
  }
  add("transformer.ln_f.weight", {d}, Init::kOnes, 0, TpSplit::kReplicated, -1);
  if (norm_bias) add("transformer.ln_f.bias", {d}, Init::kZeros, 0, TpSplit::kReplicated, -1);
  if (!c.tied) {
    add("lm_head.weight", {vp, d}, Init::kNormal, kStd, TpSplit::kRows, -1);
    s.back().real_rows = c.vocab;
    s.back().gemm_weight = true;
  }
  for (ParamSpec& p : s)  // a block's linear weights (the MoE router's GEMM stays f32)
    if (p.layer >= 0 && p.shape.size() == 2 && p.name.find("moe.router") == std::string::npos &&
        p.name.find("moe.experts") == std::string::npos)
      p.gemm_weight = true;
  return s;
}

int64_t count_params(const std::vector<ParamSpec>& specs) {
  int64_t n = 0;
  for (const auto& s : specs) n += shape_numel(s.shape);
  return n;
}

void init_param_range(const ParamSpec& spec, uint64_t seed, int64_t first, int64_t n, float* out) {
  switch (spec.init) {
    case Init::kZeros:
      for (int64_t i = 0; i < n; ++i) out[i] = 0.f;
      return;
    case Init::kOnes:
      for (int64_t i = 0; i < n; ++i) out[i] = 1.f;
      return;
    case Init::kNormal:
      break;
  }
  rng::fill_normal(out, n, seed, rng::stream_of(spec.name), static_cast<uint64_t>(first), 0.f,
                   spec.init_std);
  if (spec.real_rows >= 0) {  // padding rows of the vocabulary are zero
    const int64_t row_elems = spec.full_shape()[1];
    const int64_t pad_begin = spec.real_rows * row_elems;
    for (int64_t i = std::max<int64_t>(first, pad_begin); i < first + n; ++i) out[i - first] = 0.f;
  }
}

std::vector<ParamSpec> tp_shard_specs(std::vector<ParamSpec> specs, int rank, int size) {
  for (auto& s : specs) {
    s.global_shape = s.shape;
    s.tp_rank = rank;
    s.tp_size = size;
    auto split = [&](size_t dim, int64_t pieces) {
      if (s.shape[dim] % pieces != 0)
        fail("{}: dimension {} of size {} does not split over {} tensor-parallel ranks", s.name,
             dim, s.shape[dim], pieces);
      s.shape[dim] /= pieces;
    };
    switch (s.tp_split) {
      case TpSplit::kReplicated:
        break;
      case TpSplit::kRows:
        split(0, size);
        break;
      case TpSplit::kCols:
        split(1, size);
        break;
      case TpSplit::kBlockRows: {
        int64_t rows = 0;
        for (const int64_t b : s.row_blocks) {
          if (b % size != 0)
            fail("{}: a row block of {} rows does not split over {} tensor-parallel ranks", s.name,
                 b, size);
          rows += b;
        }
        if (rows != s.shape[0])
          fail("{}: its row blocks hold {} rows, not its {}", s.name, rows, s.shape[0]);
        s.shape[0] /= size;
        break;
      }
    }
  }
  return specs;
}

std::vector<ParamSpec> ep_shard_specs(std::vector<ParamSpec> specs, int rank, int size) {
  for (auto& s : specs) {
    if (!s.expert) continue;
    if (s.tp_split != TpSplit::kReplicated)
      fail("{}: an expert tensor must be tp-replicated to split over ep", s.name);
    if (s.global_shape.empty()) s.global_shape = s.shape;
    if (s.shape[0] % size != 0)
      fail(
          "{}: its {} experts do not split over {} expert-parallel ranks (use an --ep that "
          "divides {})",
          s.name, s.shape[0], size, s.shape[0]);
    s.shape[0] /= size;
    s.ep_rank = rank;
    s.ep_size = size;
  }
  return specs;
}

void for_each_tp_run(const ParamSpec& spec,
                     const std::function<void(int64_t, int64_t, int64_t)>& fn) {
  const Shape& g = spec.full_shape();
  const int64_t n = shape_numel(spec.shape);
  if (spec.expert && spec.ep_size > 1) {  // whole experts: one run (tp-replicated)
    fn(0, spec.ep_rank * n, n);
    return;
  }
  if (spec.tp_size <= 1 || spec.tp_split == TpSplit::kReplicated) {
    fn(0, 0, n);
    return;
  }
  const int64_t cols = g.size() > 1 ? g[1] : 1;
  const int64_t r = spec.tp_rank;
  switch (spec.tp_split) {
    case TpSplit::kReplicated:
      break;
    case TpSplit::kRows:
      fn(0, r * n, n);
      break;
    case TpSplit::kCols: {
      const int64_t lc = spec.shape[1];
      for (int64_t i = 0; i < g[0]; ++i) fn(i * lc, i * cols + r * lc, lc);
      break;
    }
    case TpSplit::kBlockRows: {
      int64_t local = 0, global = 0;
      for (const int64_t rows : spec.row_blocks) {
        const int64_t piece = rows / spec.tp_size * cols;  // this rank's part of the block
        fn(local, global + r * piece, piece);
        local += piece;
        global += rows * cols;
      }
      break;
    }
  }
}

void init_param_local(const ParamSpec& spec, uint64_t seed, int64_t first, int64_t n, float* out) {
  for_each_tp_run(spec, [&](int64_t lf, int64_t gf, int64_t len) {
    const int64_t lo = std::max(first, lf), hi = std::min(first + n, lf + len);
    if (lo < hi) init_param_range(spec, seed, gf + (lo - lf), hi - lo, out + (lo - first));
  });
}

void tp_slice(const ParamSpec& spec, const float* global, float* out) {
  for_each_tp_run(spec, [&](int64_t lf, int64_t gf, int64_t len) {
    std::copy(global + gf, global + gf + len, out + lf);
  });
}

ParamStore::ParamStore(std::vector<ParamSpec> specs, DType dtype, StoreOptions options) {
  numel_ = count_params(specs);
  const int64_t m = std::max<int64_t>(1, options.pad_multiple);
  padded_numel_ = (numel_ + m - 1) / m * m;
  if (options.full_values) {
    flat_values_ = Tensor::empty({padded_numel_}, dtype, mem::Category::kParameters);
    if (padded_numel_ > numel_) flat_values_.view(numel_, {padded_numel_ - numel_}).zero_();
  }
  if (options.full_grads)
    flat_grads_ = Tensor::zeros({padded_numel_}, DType::kF32, mem::Category::kGradients);
  bf16_copy_ = options.bf16_copy;
  int64_t offset = 0, bf16_offset = 0;
  for (auto& spec : specs) {
    Param p;
    const int64_t n = shape_numel(spec.shape);
    if (options.full_values) p.value = flat_values_.view(offset, spec.shape);
    if (options.full_grads) p.grad = flat_grads_.view(offset, spec.shape);
    p.offset_elems = offset;
    if (bf16_copy_ && spec.gemm_weight) {
      p.bf16_offset_elems = bf16_offset;
      bf16_offset += n;
    }
    p.spec = std::move(spec);
    offset += n;
    params_.push_back(std::move(p));
  }
  if (bf16_copy_ && options.full_bf16 && bf16_offset > 0) {
    flat_bf16_ = Tensor::empty({bf16_offset}, DType::kBF16, mem::Category::kParameters);
    bind_bf16(0, static_cast<int>(params_.size()), flat_bf16_);
  }
}

void ParamStore::initialize(uint64_t seed) {
  if (!flat_values_.defined()) return;
  std::vector<float> host;  // a GPU's values are drawn on the host, then copied
  for (auto& p : params_) {
    const int64_t n = p.value.numel();
    if (p.value.device() == mem::Device::kCpu) {
      init_param_local(p.spec, seed, 0, n, p.value.f32());
      continue;
    }
    host.resize(static_cast<size_t>(n));
    init_param_local(p.spec, seed, 0, n, host.data());
    device::copy(p.value.f32(), p.value.device(), host.data(), mem::Device::kCpu, n * 4);
  }
  if (flat_bf16_.defined()) refresh_bf16();
}

void ParamStore::initialize_range(uint64_t seed, int64_t first, int64_t n, float* out) const {
  // `out` is on the calling thread's device; a GPU's range is drawn on the host first.
  std::vector<float> host;
  float* dst = out;
  if (device::on_cuda()) {
    host.resize(static_cast<size_t>(n));
    dst = host.data();
  }
  for (int64_t i = 0; i < n; ++i) dst[i] = 0.f;  // padding
  for_each_in_range(first, first + n, [&](const Param& p, int64_t lo, int64_t hi) {
    init_param_local(p.spec, seed, lo - p.offset_elems, hi - lo, dst + (lo - first));
  });
  if (dst != out) device::copy(out, mem::Device::kCuda, dst, mem::Device::kCpu, n * 4);
}

namespace {
void bind(std::vector<Param>& params, int first, int end, const Tensor& buffer, bool values) {
  const int64_t base = params[static_cast<size_t>(first)].offset_elems;
  for (int i = first; i < end; ++i) {
    Param& p = params[static_cast<size_t>(i)];
    Tensor v = buffer.view(p.offset_elems - base, p.spec.shape);
    (values ? p.value : p.grad) = v;
  }
}
}  // namespace

void ParamStore::bind_values(int first, int end, const Tensor& buffer) {
  bind(params_, first, end, buffer, true);
}

void ParamStore::bind_grads(int first, int end, const Tensor& buffer) {
  bind(params_, first, end, buffer, false);
}

void ParamStore::bind_bf16(int first, int end, const Tensor& buffer) {
  int64_t base = -1;
  for (int i = first; i < end; ++i) {
    Param& p = params_[static_cast<size_t>(i)];
    if (p.bf16_offset_elems < 0) continue;
    if (base < 0) base = p.bf16_offset_elems;
    p.value_bf16 = buffer.view(p.bf16_offset_elems - base, p.spec.shape);
  }
}

void ParamStore::refresh_bf16(int first, int end) {
  profile::Scope prof("bf16.weights");  // the working copy from the f32 master values
  for (int i = first; i < end; ++i) {
    Param& p = params_[static_cast<size_t>(i)];
    if (p.bf16_offset_elems >= 0)
      kernels::to_bf16(p.value_bf16.bf16p(), p.value.f32(), p.value.numel());
  }
}

int64_t ParamStore::bf16_elems(int first, int end) const {
  int64_t n = 0;
  for (int i = first; i < end; ++i) {
    const Param& p = params_[static_cast<size_t>(i)];
    if (p.bf16_offset_elems >= 0) n += shape_numel(p.spec.shape);
  }
  return n;
}

Param& ParamStore::get(const std::string& name) {
  for (auto& p : params_)
    if (p.spec.name == name) return p;
  fail("no parameter named '{}' in this model", name);
}

const Param* ParamStore::find(const std::string& name) const {
  for (const auto& p : params_)
    if (p.spec.name == name) return &p;
  return nullptr;
}

}  // namespace mt::model

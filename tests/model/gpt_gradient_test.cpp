// The whole model's gradient against central finite differences, one parameter tensor at a
// time: for a random unit direction v over that tensor, (L(p + eps v) - L(p - eps v)) / 2eps
// must equal <dL/dp, v>.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/philox.h"
#include "kernels/kernels.h"
#include "model/gpt.h"

namespace mt::model {
namespace {

GptConfig small_config(bool bias, bool tied) {
  GptConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 16;
  c.d_ff = 32;
  c.vocab = 37;  // padded to 128: the padding must not change the loss or get gradient
  c.seq_len = 8;
  c.bias = bias;
  c.tied = tied;
  return c;
}

// A Llama-family block: RMSNorm, rotary positions (Llama 3 scaling with a short original
// context, so that all three frequency bands occur), SwiGLU, kv_heads key/value heads.
GptConfig small_llama(bool tied, int64_t kv_heads) {
  GptConfig c = small_config(false, tied);
  c.n_head = 4;  // head dim 4
  c.n_kv_head = kv_heads;
  c.d_ff = 24;
  c.norm = NormKind::kRmsNorm;
  c.mlp = MlpKind::kSwiGlu;
  c.positions = Positions::kRope;
  c.rope_theta = 50.0;  // large angles over 8 positions
  c.rope_scaling.llama3 = true;
  c.rope_scaling.factor = 4;
  c.rope_scaling.original_max_position = 8;
  return c;
}

void check_model_gradient(const GptConfig& c) {
  kernels::set_threads(1);
  Gpt gpt(c, 42);
  // Larger-than-GPT-2 init so that every path carries a gradient well above f32 noise.
  for (auto& p : gpt.params().params())
    if (p.spec.init == Init::kNormal)
      for (int64_t i = 0; i < p.value.numel(); ++i) p.value.f32()[i] *= 10.f;
  const int64_t B = 2, T = 8, N = B * T;
  std::vector<int32_t> in(N), tgt(N);
  for (int64_t i = 0; i < N; ++i) {
    in[i] = static_cast<int32_t>(rng::uniform(1, 1, i) * c.vocab);
    tgt[i] = static_cast<int32_t>(rng::uniform(1, 2, i) * c.vocab);
  }
  Activations a = gpt.make_activations(B, T);
  gpt.params().zero_grads();
  gpt.forward(a, in.data(), tgt.data());
  gpt.backward(a, 1.0f / static_cast<float>(N));  // d(mean loss)

  for (auto& p : gpt.params().params()) {
    const int64_t n = p.value.numel();
    std::vector<float> v(n);
    double norm = 0;
    for (int64_t i = 0; i < n; ++i)
      norm += (v[i] = rng::normal(7, rng::stream_of(p.spec.name), i)) * v[i];
    // Directions stay in the real vocabulary rows (padding rows are never read).
    if (p.spec.real_rows >= 0)
      for (int64_t i = p.spec.real_rows * p.spec.shape[1]; i < n; ++i) v[i] = 0;
    double analytic = 0;
    for (int64_t i = 0; i < n; ++i) analytic += static_cast<double>(p.grad.f32()[i]) * v[i];
    norm = 0;
    for (float x : v) norm += x * x;
    norm = std::sqrt(norm);
    analytic /= norm;
    // eps = 1e-2 along a unit direction: the truncation error (eps^2 times a third
    // derivative of order 1) is ~1e-4, the f32 rounding of the loss (~3e-7 relative)
    // contributes ~1e-5 after dividing by 2 eps.
    const double eps = 1e-2;
    std::vector<float> saved(p.value.f32(), p.value.f32() + n);
    auto loss_at = [&](double s) {
      for (int64_t i = 0; i < n; ++i)
        p.value.f32()[i] = saved[i] + static_cast<float>(s * v[i] / norm);
      return static_cast<double>(gpt.forward(a, in.data(), tgt.data()));
    };
    const double numeric = (loss_at(eps) - loss_at(-eps)) / (2 * eps);
    loss_at(0);
    EXPECT_NEAR(analytic, numeric, 1e-3 + 1e-2 * std::abs(numeric)) << p.spec.name;
  }
  // The vocabulary padding rows get exactly zero gradient.
  const Param& wte = gpt.params().get("transformer.wte.weight");
  for (int64_t i = c.vocab * c.d_model; i < wte.grad.numel(); ++i)
    ASSERT_EQ(wte.grad.f32()[i], 0.f);
}

TEST(GptGradient, MatchesFiniteDifferencesTiedWithBias) {
  check_model_gradient(small_config(true, true));
}
TEST(GptGradient, MatchesFiniteDifferencesUntiedWithoutBias) {
  check_model_gradient(small_config(false, false));
}
TEST(GptGradient, LlamaGroupedQueryMatchesFiniteDifferences) {
  check_model_gradient(small_llama(false, 2));
}
TEST(GptGradient, LlamaMultiQueryTiedMatchesFiniteDifferences) {
  check_model_gradient(small_llama(true, 1));
}

TEST(GptParams, ShardOfAnyTensorDrawsItsOwnSlice) {
  // Layout independence: initialising a range of a tensor equals that range of the whole.
  const GptConfig c = small_config(true, true);
  for (const auto& spec : gpt_param_specs(c)) {
    const int64_t n = shape_numel(spec.shape);
    std::vector<float> whole(n), part(n / 3);
    init_param_range(spec, 5, 0, n, whole.data());
    init_param_range(spec, 5, n / 2, n / 3, part.data());
    for (int64_t i = 0; i < n / 3; ++i) ASSERT_EQ(part[i], whole[n / 2 + i]) << spec.name;
  }
}

TEST(GptParams, LlamaCountsMatchThePublishedModels) {
  // Hugging Face's parameter counts (model.num_parameters()): Llama 3.2 1B 1,235,814,400
  // (tied), Llama 3 8B 8,030,261,248 (untied). 128256 is a multiple of 128: no padding.
  EXPECT_EQ(count_params(gpt_param_specs(preset("llama3.2-1b"))), 1235814400);
  EXPECT_EQ(count_params(gpt_param_specs(preset("llama3-8b"))), 8030261248);
  const auto specs = gpt_param_specs(preset("llama-tiny"));
  for (const auto& s : specs) {
    EXPECT_EQ(s.name.find("bias"), std::string::npos) << s.name;  // no biases
    EXPECT_NE(s.name, "transformer.wpe.weight");                  // no position table
  }
}

TEST(GptParams, Gpt2CountsAndNames) {
  // GPT-2 124M: 124,439,808 parameters with the real vocabulary 50257 (Radford et al.;
  // Hugging Face's count); padding to 50304 adds 47 * 768.
  const auto specs = gpt_param_specs(preset("gpt2-124m"));
  EXPECT_EQ(count_params(specs), 124439808 + 47 * 768);
  EXPECT_EQ(specs[0].name, "transformer.wte.weight");
  EXPECT_EQ(specs[2].name, "transformer.h.0.ln_1.weight");
  EXPECT_EQ(specs.back().name, "transformer.ln_f.bias");
}

}  // namespace
}  // namespace mt::model

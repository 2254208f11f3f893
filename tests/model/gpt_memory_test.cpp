// The accounting allocator's counts equal the memory formulas of docs/flops.md, exactly.
#include <gtest/gtest.h>

#include "model/gpt.h"

namespace mt::model {
namespace {

TEST(GptMemory, ParametersGradientsAndActivationsMatchTheFormulas) {
  GptConfig c = preset("tiny");
  c.vocab = 300;  // padded to 384
  mem::Tracker tracker;
  mem::ScopedTracker scope(tracker);
  Gpt gpt(c, 1);
  const int64_t P = count_params(gpt_param_specs(c));
  auto s = tracker.snapshot();
  EXPECT_EQ(s.of(mem::Category::kParameters), 4 * P);
  EXPECT_EQ(s.of(mem::Category::kGradients), 4 * P);

  const int64_t B = 3, T = 32, N = B * T, C = c.d_model, F = c.d_ff, H = c.n_head;
  {
    Activations a = gpt.make_activations(B, T);
    const int64_t per_layer = N * (8 * C + 2 * F + 4) + B * H * T * T;
    const int64_t outside = N * (C + C + 2 + c.padded_vocab() + 2);
    EXPECT_EQ(tracker.snapshot().of(mem::Category::kActivations), 4 * (c.n_layer * per_layer + outside));
    std::vector<int32_t> tok(N, 1);
    gpt.forward(a, tok.data(), tok.data());
    gpt.backward(a, 1.0f / N);
    EXPECT_EQ(tracker.snapshot().of(mem::Category::kWorkspace), 4 * (N * (6 * C + 2 * F) + B * H * T * T));
  }
  EXPECT_EQ(tracker.snapshot().of(mem::Category::kActivations), 0);
}

TEST(GptFlops, MatchesMegatronFormula) {
  // Narayanan et al. 2021, eq. 3 without recomputation: 72 B s L h^2 (1 + s/6h + V/12hL)
  // per step for F = 4h, i.e. per token divided by B s.
  const GptConfig c = preset("gpt2-124m");
  const double L = 12, h = 768, s = 1024, V = c.padded_vocab();
  const double megatron = 72 * L * h * h * (1 + s / (6 * h) + V / (12 * h * L));
  EXPECT_NEAR(training_flops_per_token(c, 1024) / megatron, 1.0, 1e-12);
}

}  // namespace
}  // namespace mt::model

// Generation (model/decode.h, model/sample.h): a fixed seed gives the same tokens; a
// temperature near 0 gives the argmax continuation of the model's own full forward; the KV
// cache gives the same tokens and logits as running the whole prefix for every token; for
// GPT-2 (learned positions, LayerNorm, GELU) and Llama (RoPE, RMSNorm, SwiGLU, grouped kv
// heads) alike.
#include "model/sample.h"

#include <gtest/gtest.h>

#include <set>

#include "core/error.h"

namespace mt::model {
namespace {

// Small enough to run in milliseconds; seq 48 leaves room for a prompt and 40 tokens.
GptConfig small(const std::string& name) {
  GptConfig c = preset(name);
  c.n_layer = 2;
  c.seq_len = 48;
  return c;
}

// The logits of every position of `seq` from one full forward: [T, padded_vocab].
std::vector<float> full_logits(Gpt& gpt, const std::vector<int32_t>& seq) {
  const int64_t T = static_cast<int64_t>(seq.size());
  Activations a = gpt.make_activations(1, T);
  const std::vector<int32_t> targets(seq.size(), 0);
  gpt.forward(a, seq.data(), targets.data());
  const float* l = a.logits.f32();
  return {l, l + T * gpt.config().padded_vocab()};
}

class Sample : public ::testing::TestWithParam<std::string> {};

const std::vector<int32_t> kPrompt = {84, 104, 101, 32, 115};  // "The s"

TEST_P(Sample, FixedSeedIsDeterministicAndSeedsDiffer) {
  Gpt gpt(small(GetParam()), 11);
  const SampleOptions o{1.0, 0, 7};
  Decoder d1(gpt, 48), d2(gpt, 48), d3(gpt, 48);
  const auto a = generate(d1, kPrompt, 40, o);
  const auto b = generate(d2, kPrompt, 40, o);
  EXPECT_EQ(a, b);
  ASSERT_EQ(a.size(), 40u);
  // Another seed: 40 draws from a near-uniform 256-way softmax (random weights) all equal
  // would have probability far below 1e-40.
  const auto c = generate(d3, kPrompt, 40, SampleOptions{1.0, 0, 8});
  EXPECT_NE(a, c);
}

TEST_P(Sample, TemperatureNearZeroIsTheArgmaxOfTheFullForward) {
  Gpt gpt(small(GetParam()), 12);
  const int64_t Vp = gpt.config().padded_vocab(), V = gpt.config().vocab;
  Decoder d(gpt, 48);
  const auto out = generate(d, kPrompt, 40, SampleOptions{1e-6, 0, 3});
  std::vector<int32_t> seq = kPrompt;
  seq.insert(seq.end(), out.begin(), out.end());
  const std::vector<float> logits = full_logits(gpt, seq);
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t row = static_cast<int64_t>(kPrompt.size() + i) - 1;
    EXPECT_EQ(out[i], argmax_token(logits.data() + row * Vp, V)) << "token " << i;
  }
  // Temperature 0 is the argmax exactly, by definition.
  Decoder d0(gpt, 48);
  EXPECT_EQ(generate(d0, kPrompt, 40, SampleOptions{0.0, 0, 3}), out);
}

TEST_P(Sample, KvCacheEqualsTheWholePrefixEveryToken) {
  Gpt gpt(small(GetParam()), 13);
  const int64_t Vp = gpt.config().padded_vocab(), V = gpt.config().vocab;
  for (const SampleOptions& o : {SampleOptions{1.0, 0, 5}, SampleOptions{0.8, 10, 6}}) {
    Decoder d(gpt, 48);
    const auto cached = generate(d, kPrompt, 40, o);
    EXPECT_EQ(cached, generate_uncached(gpt, kPrompt, 40, o));
  }
  // And the logits of every position: the cache's step against the full forward's rows.
  // They differ only by f32 summation order (attention over the cache vs the blocked
  // kernel; one-row vs many-row GEMMs): relative error ~ (terms summed) · 2^-24 ~ 1e-5 of
  // logits of size ~1, so 1e-4 absolute is a wide margin that still catches a wrong
  // position or a stale cache entry (those move logits by 1e-2 or more).
  std::vector<int32_t> seq(48);
  for (size_t i = 0; i < seq.size(); ++i) seq[i] = static_cast<int32_t>((i * 37 + 11) % V);
  const std::vector<float> ref = full_logits(gpt, seq);
  Decoder d(gpt, 48);
  double worst = 0;
  for (size_t t = 0; t < seq.size(); ++t) {
    const float* got = d.step(seq[t]);
    for (int64_t j = 0; j < V; ++j)
      worst = std::max(worst, std::abs(double(got[j]) - ref[t * Vp + j]));
  }
  EXPECT_LT(worst, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Models, Sample, ::testing::Values("tiny", "llama-tiny", "mixtral-tiny"));

TEST(SampleToken, TopKAndTemperature) {
  std::vector<float> logits(256);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = 0.01f * static_cast<float>(i % 97);
  // top-k 1 and temperature 0 are the argmax (the lowest id among equal maxima: 96).
  EXPECT_EQ(sample_token(logits.data(), 256, SampleOptions{1.0, 1, 0}, 0), 96);
  EXPECT_EQ(sample_token(logits.data(), 256, SampleOptions{0.0, 0, 0}, 0), 96);
  // top-k 5 draws only among the 5 largest: ids 96, 193 (0.96), 95, 192, 94 (0.95, 0.94).
  std::set<int32_t> seen;
  for (uint64_t draw = 0; draw < 500; ++draw)
    seen.insert(sample_token(logits.data(), 256, SampleOptions{5.0, 5, 1}, draw));
  EXPECT_EQ(seen, (std::set<int32_t>{94, 95, 96, 192, 193}));
}

TEST(SampleToken, RefusesAPromptPastTheModel) {
  Gpt gpt(small("tiny"), 1);
  Decoder d(gpt, 48);
  EXPECT_THROW(generate(d, kPrompt, 44, SampleOptions{}), Error);  // 5 + 44 > 48
  EXPECT_THROW(generate(d, {}, 4, SampleOptions{}), Error);
  EXPECT_THROW(Decoder(gpt, 49), Error);
}

}  // namespace
}  // namespace mt::model

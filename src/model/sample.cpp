#include "model/sample.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/philox.h"

namespace mt::model {

int32_t argmax_token(const float* logits, int64_t vocab) {
  return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
}

int32_t sample_token(const float* logits, int64_t vocab, const SampleOptions& o, uint64_t draw) {
  if (o.temperature <= 0) return argmax_token(logits, vocab);
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  const int64_t k = o.top_k > 0 ? std::min(o.top_k, vocab) : vocab;
  // Largest first, the lower id first among equals: a fixed order for the cumulative sum.
  auto larger = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), larger);
  const double top = logits[ids[0]];
  std::vector<double> p(static_cast<size_t>(k));
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) {
    p[static_cast<size_t>(i)] =
        std::exp((logits[ids[static_cast<size_t>(i)]] - top) / o.temperature);
    sum += p[static_cast<size_t>(i)];
  }
  const double u = rng::uniform(o.seed, rng::stream_of("sample"), draw) * sum;
  double acc = 0;
  for (int64_t i = 0; i < k; ++i) {
    acc += p[static_cast<size_t>(i)];
    if (u < acc) return ids[static_cast<size_t>(i)];
  }
  return ids[static_cast<size_t>(k - 1)];  // u rounded up to the sum
}

namespace {
void check_request(const GptConfig& c, const std::vector<int32_t>& prompt, int64_t n) {
  if (prompt.empty()) fail("the prompt is empty (give at least one token)");
  if (n < 0) fail("--tokens {} must be at least 0", n);
  const int64_t need = static_cast<int64_t>(prompt.size()) + n;
  if (need > c.seq_len)
    fail(
        "a prompt of {} tokens and {} new ones need {} positions; the model has seq_len={} "
        "(ask for at most {} tokens)",
        prompt.size(), n, need, c.seq_len,
        std::max<int64_t>(0, c.seq_len - static_cast<int64_t>(prompt.size())));
}
}  // namespace

std::vector<int32_t> generate(Decoder& d, const std::vector<int32_t>& prompt, int64_t n,
                              const SampleOptions& o) {
  const GptConfig& c = d.config();
  check_request(c, prompt, n);
  if (d.position() + static_cast<int64_t>(prompt.size()) + n > d.max_len())
    fail("the decoder holds {} positions; {} are used and {} more are asked for", d.max_len(),
         d.position(), prompt.size() + static_cast<size_t>(n));
  const float* logits = nullptr;
  for (int32_t t : prompt) logits = d.step(t);
  std::vector<int32_t> out;
  for (int64_t i = 0; i < n; ++i) {
    out.push_back(sample_token(logits, c.vocab, o, static_cast<uint64_t>(i)));
    if (i + 1 < n) logits = d.step(out.back());
  }
  return out;
}

std::vector<int32_t> generate_uncached(Gpt& gpt, const std::vector<int32_t>& prompt, int64_t n,
                                       const SampleOptions& o) {
  const GptConfig& c = gpt.config();
  check_request(c, prompt, n);
  std::vector<int32_t> seq = prompt, out;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t T = static_cast<int64_t>(seq.size());
    Activations a = gpt.make_activations(1, T);
    const std::vector<int32_t> targets(seq.size(), 0);  // the loss is not used
    gpt.forward(a, seq.data(), targets.data());
    const float* last = a.logits.f32() + (T - 1) * c.padded_vocab();
    out.push_back(sample_token(last, c.vocab, o, static_cast<uint64_t>(i)));
    seq.push_back(out.back());
  }
  return out;
}

}  // namespace mt::model

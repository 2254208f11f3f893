#include "model/config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace mt::model {

namespace {
GptConfig make(const char* name, int64_t layers, int64_t heads, int64_t d, int64_t vocab,
               int64_t seq) {
  GptConfig c;
  c.name = name;
  c.n_layer = layers;
  c.n_head = heads;
  c.d_model = d;
  c.d_ff = 4 * d;
  c.vocab = vocab;
  c.seq_len = seq;
  return c;
}
}  // namespace

std::vector<std::string> preset_names() {
  return {"tiny", "gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-1.5b"};
}

GptConfig preset(const std::string& name) {
  // `tiny` is byte-level (vocab 256) so that it trains on `meshtrain prepare` output.
  if (name == "tiny") return make("tiny", 4, 4, 128, 256, 128);
  if (name == "gpt2-124m") return make("gpt2-124m", 12, 12, 768, 50257, 1024);
  if (name == "gpt2-350m") return make("gpt2-350m", 24, 16, 1024, 50257, 1024);
  if (name == "gpt2-774m") return make("gpt2-774m", 36, 20, 1280, 50257, 1024);
  if (name == "gpt2-1.5b") return make("gpt2-1.5b", 48, 25, 1600, 50257, 1024);
  fail("unknown model preset '{}' (choose one of {}, or give --config FILE.json)", name,
       fmt::join(preset_names(), ", "));
}

void GptConfig::validate() const {
  auto positive = [](const char* flag, int64_t v) {
    if (v < 1) fail("{} {} must be at least 1", flag, v);
  };
  positive("--n-layer", n_layer);
  positive("--n-head", n_head);
  positive("--d-model", d_model);
  positive("--d-ff", d_ff);
  positive("--vocab", vocab);
  positive("--seq", seq_len);
  if (d_model % n_head != 0) {
    std::vector<int64_t> ok;  // up to 64 heads: not a scan up to d_model (it may be 10^15)
    for (int64_t h = 1; h <= std::min<int64_t>(d_model, 64); ++h)
      if (d_model % h == 0) ok.push_back(h);
    fail("--d-model {} is not divisible by --n-head {} (choose n_head among {})", d_model, n_head,
         fmt::join(ok, ", "));
  }
  if (vocab > 65536)
    fail("--vocab {} does not fit the uint16 tokens of the data format (at most 65536)", vocab);
}

void check_tp(const GptConfig& c, int tp, bool sp) {
  if (tp < 1) fail("--tp {} must be at least 1", tp);
  if (sp && tp == 1) fail("--sp needs tensor parallelism (use --tp 2 or more with --sp)");
  auto valid = [&] {
    // The divisors up to kMaxListed: not a scan up to n_head (a config file may say 10^15).
    constexpr int64_t kMaxListed = 1024;
    std::vector<int64_t> ok;
    for (int64_t t = 1; t <= std::min(c.n_head, kMaxListed); ++t)
      if (c.n_head % t == 0 && c.d_ff % t == 0 && (!sp || c.seq_len % t == 0)) ok.push_back(t);
    return fmt::format("{}{}", fmt::join(ok, ", "), c.n_head > kMaxListed ? ", ..." : "");
  };
  if (c.n_head % tp != 0)
    fail("--tp {} does not divide n_head={} (each rank owns whole heads; choose --tp among {})", tp,
         c.n_head, valid());
  if (c.d_ff % tp != 0)
    fail("--tp {} does not divide d_ff={} (choose --tp among {})", tp, c.d_ff, valid());
  if (sp && c.seq_len % tp != 0)
    fail(
        "--sp splits the sequence over the tp ranks, but --seq {} is not divisible by --tp {} "
        "(use a --seq that is a multiple of {}, or --tp among {})",
        c.seq_len, tp, tp, valid());
}

int64_t tp_vocab_pad(int tp) { return std::lcm<int64_t>(kVocabPadMultiple, tp); }

}  // namespace mt::model

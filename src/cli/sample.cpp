// `meshtrain sample --weights W --prompt TEXT --tokens N [--temperature T --top-k K --seed S]`:
// text from an exported model (model/sample.h), through a KV cache. A byte-level model
// (vocab 256, `meshtrain prepare`'s tokens) reads the prompt's bytes and prints text; any
// other reads the prompt as token ids and prints ids (no tokenizer yet).
#include "model/sample.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <memory>
#include <sstream>

#include "cli/commands.h"
#include "core/error.h"
#include "kernels/kernels.h"
#include "train/hf_export.h"

namespace mt::cli {

namespace {
constexpr int64_t kByteVocab = 256;

std::vector<int32_t> parse_prompt(const std::string& text, int64_t vocab) {
  std::vector<int32_t> ids;
  if (vocab == kByteVocab) {
    for (unsigned char ch : text) ids.push_back(ch);
    return ids;
  }
  std::istringstream in(text);
  std::string word;
  while (in >> word) {
    size_t used = 0;
    long long id = -1;
    try {
      id = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != word.size() || id < 0 || id >= vocab)
      fail(
          "--prompt: '{}' is not a token id in [0, {}) (a model whose vocabulary is not "
          "byte-level takes its prompt as token ids separated by spaces)",
          word, vocab);
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}
}  // namespace

void register_sample(CLI::App& app) {
  struct Flags {
    std::string weights, prompt;
    int64_t tokens = 200, top_k = 0;
    double temperature = 1.0;
    uint64_t seed = 0;
    bool no_cache = false;
    std::optional<int64_t> n_head, threads;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* cmd =
      app.add_subcommand("sample", "generate text from exported GPT-2 or Llama weights");
  cmd->add_option("--weights", f->weights,
                  "safetensors file in Hugging Face GPT-2 names, or a model folder (config.json "
                  "and model.safetensors, or the hub's shards; Llama weights need the folder)")
      ->required();
  cmd->add_option("--prompt", f->prompt,
                  "text (byte-level models), else token ids separated by spaces")
      ->required();
  cmd->add_option("--tokens", f->tokens, "tokens to generate");
  cmd->add_option("--temperature", f->temperature,
                  "divides the logits before the softmax; 0: always the most likely token");
  cmd->add_option("--top-k", f->top_k, "draw among the K most likely tokens only (0: all)");
  cmd->add_option("--seed", f->seed, "seed of the draws: the same seed gives the same text");
  cmd->add_flag("--no-cache", f->no_cache,
                "run the whole prefix for every token instead of the KV cache (slower: for "
                "comparison)");
  cmd->add_option("--n-head", f->n_head,
                  "attention heads, when the file does not record them (else must match)");
  cmd->add_option("--threads", f->threads, "intra-op threads");
  cmd->callback([f] {
    if (f->temperature < 0) fail("--temperature {} must be at least 0", f->temperature);
    if (f->top_k < 0) fail("--top-k {} must be at least 0 (0: the whole vocabulary)", f->top_k);
    kernels::set_threads(f->threads ? static_cast<int>(*f->threads) : kernels::host_cores());
    const train::HfWeights w = train::read_hf_weights(f->weights);
    model::GptConfig c = train::config_from_hf(w, f->n_head);
    c.validate();
    const std::vector<int32_t> prompt = parse_prompt(f->prompt, c.vocab);
    if (prompt.empty()) fail("--prompt is empty (give at least one byte or token id)");
    const int64_t need = static_cast<int64_t>(prompt.size()) + f->tokens;
    if (f->tokens < 0) fail("--tokens {} must be at least 0", f->tokens);
    if (need > c.seq_len)
      fail(
          "--prompt has {} tokens and --tokens {} asks for {} more: {} positions, but the model's "
          "seq_len is {} (use --tokens {} or less)",
          prompt.size(), f->tokens, f->tokens, need, c.seq_len,
          std::max<int64_t>(0, c.seq_len - static_cast<int64_t>(prompt.size())));
    model::Gpt gpt(c, 0);
    train::load_hf_weights(gpt, w.file, w.path);
    const model::SampleOptions o{f->temperature, f->top_k, f->seed};
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<int32_t> out;
    if (f->no_cache) {
      out = model::generate_uncached(gpt, prompt, f->tokens, o);
    } else {
      model::Decoder d(gpt, need);
      out = model::generate(d, prompt, f->tokens, o);
    }
    const double time_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (c.vocab == kByteVocab) {
      std::string text = f->prompt;
      for (int32_t t : out) text.push_back(static_cast<char>(t));
      fmt::print("{}\n", text);
    } else {
      fmt::print("{}\n", fmt::join(out, " "));
    }
    fmt::print(stderr, "{} tokens in {:.3f} s ({:.1f} tokens/s, {})\n", out.size(), time_s,
               static_cast<double>(out.size()) / std::max(time_s, 1e-9),
               f->no_cache ? "the whole prefix per token" : "KV cache");
  });
}

}  // namespace mt::cli

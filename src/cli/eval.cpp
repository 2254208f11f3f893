// `meshtrain eval --weights FILE.safetensors --data FILE.bin --batch B --seq T --batches K`:
// the mean loss over the first K batches, taken in order as llm.c's loader takes them.
#include <fmt/format.h>

#include <memory>

#include "cli/commands.h"
#include "cli/model_flags.h"
#include "core/error.h"
#include "kernels/kernels.h"
#include "model/gpt.h"
#include "train/hf_export.h"
#include "train/token_corpus.h"

namespace mt::cli {

void register_eval(CLI::App& app) {
  struct Flags {
    std::string weights, data, data_format = "auto";
    int64_t batch = 4, batches = 1;
    std::optional<int64_t> seq, n_head, threads;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* cmd =
      app.add_subcommand("eval", "mean loss of safetensors GPT-2 or Llama weights on a token file");
  cmd->add_option("--weights", f->weights,
                  "safetensors file in Hugging Face GPT-2 names, or a model folder "
                  "(config.json and model.safetensors, or the hub's shards with "
                  "model.safetensors.index.json; Llama weights need the folder)")
      ->required();
  cmd->add_option("--data", f->data,
                  "tokens: llm.c files, Megatron-LM PREFIXes (.idx + .bin), a comma-separated "
                  "list or a glob, read as one stream (docs/data.md)")
      ->required();
  cmd->add_option("--data-format", f->data_format,
                  "auto (default: llm.c by its header, Megatron-LM by its .idx), llmc, nanogpt "
                  "(headerless uint16) or megatron");
  cmd->add_option("--batch", f->batch, "sequences per batch");
  cmd->add_option("--seq", f->seq, "sequence length (default: the model's)");
  cmd->add_option("--batches", f->batches, "batches to average over, from the start of the file");
  cmd->add_option("--n-head", f->n_head,
                  "attention heads, when the file does not record them (else must match)");
  cmd->add_option("--threads", f->threads, "intra-op threads");
  cmd->callback([f] {
    kernels::set_threads(f->threads ? static_cast<int>(*f->threads) : kernels::host_cores());
    const train::HfWeights w = train::read_hf_weights(f->weights);
    const train::SafetensorsFile& file = w.file;
    model::GptConfig c = train::config_from_hf(w, f->n_head);
    c.validate();
    const int64_t T = f->seq.value_or(c.seq_len);
    if (f->batch < 1 || f->batches < 1)
      fail("--batch {} and --batches {} must be at least 1", f->batch, f->batches);
    model::Gpt gpt(c, 0);
    train::load_hf_weights(gpt, file, w.path);
    const train::TokenCorpus tokens(f->data, c.vocab, train::parse_data_format(f->data_format));
    const int64_t need = f->batches * f->batch * T + 1;
    if (tokens.num_tokens() < need)
      fail("data '{}' has {} tokens; {} batches of {} x {} need {}", f->data, tokens.num_tokens(),
           f->batches, f->batch, T, need);
    train::SequenceSampler sampler(tokens, T, 0, (tokens.num_tokens() - 1) / T);
    model::Activations acts = gpt.make_activations(f->batch, T);
    std::vector<int32_t> in(f->batch * T), tgt(f->batch * T);
    double sum = 0;
    for (int64_t k = 0; k < f->batches; ++k) {
      sampler.fill(k * f->batch, f->batch, in.data(), tgt.data());
      sum += gpt.forward(acts, in.data(), tgt.data());
    }
    fmt::print("{{\"loss\": {:.9g}}}\n", sum / static_cast<double>(f->batches));
  });
}

}  // namespace mt::cli

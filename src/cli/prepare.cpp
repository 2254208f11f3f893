// `meshtrain prepare TEXT... -o out.bin [--format llmc|megatron]`: UTF-8 text to byte-level
// tokens (vocab 256), in llm.c's token-file format or as a Megatron-LM indexed dataset
// (PREFIX.bin + PREFIX.idx, one document per text file).
#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>

#include "cli/commands.h"
#include "core/error.h"
#include "train/output_paths.h"
#include "train/token_file.h"

namespace mt::cli {

namespace {

namespace fs = std::filesystem;

constexpr int64_t kByteVocab = 256;

// Refuses, before anything is read or written, an output that cannot be written or that is
// one of the inputs (the tokens would replace the text), and inputs that are not files.
void check_paths(const std::vector<std::string>& inputs, const std::vector<std::string>& outputs) {
  for (const std::string& output : outputs) {
    train::check_output_file(output, "-o");  // a file, in a folder that exists and is writable
    for (const std::string& path : inputs) {
      if (fs::is_directory(path))
        fail("text file '{}' is a directory: name the files in it (e.g. {}/*.txt)", path, path);
      if (fs::exists(path) && fs::exists(output) && fs::equivalent(path, output))
        fail(
            "-o '{}' is also an input ('{}'): writing the tokens would replace the text (choose "
            "another output name)",
            output, path);
    }
  }
}

void append_bytes(const std::string& path, std::vector<uint16_t>& tokens) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read text file '{}': {}", path, std::strerror(errno));
  std::string text;
  try {
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } catch (const std::exception& e) {  // libstdc++ throws from underflow on a read error
    fail("cannot read text file '{}': {}", path, e.what());
  }
  for (unsigned char ch : text) tokens.push_back(ch);
}

}  // namespace

void register_prepare(CLI::App& app) {
  struct Flags {
    std::vector<std::string> inputs;
    std::string output;
    std::string format = "llmc";
  };
  auto f = std::make_shared<Flags>();
  CLI::App* cmd =
      app.add_subcommand("prepare", "turn UTF-8 text into byte-level tokens (vocab 256)");
  cmd->add_option("text", f->inputs, "text files, concatenated in order")->required();
  cmd->add_option("-o,--output", f->output,
                  "token file to write (llmc), or the PREFIX of PREFIX.bin + PREFIX.idx "
                  "(megatron; PREFIX.bin or PREFIX.idx name the same pair)")
      ->required();
  cmd->add_option("--format", f->format,
                  "llmc: one llm.c token file (uint16); megatron: a Megatron-LM indexed dataset, "
                  "one document per text file")
      ->check(CLI::IsMember({"llmc", "megatron"}))
      ->capture_default_str();
  cmd->callback([f] {
    const bool megatron = f->format == "megatron";
    const std::string prefix = train::megatron_prefix(f->output);
    check_paths(f->inputs, megatron ? std::vector<std::string>{prefix + ".bin", prefix + ".idx"}
                                    : std::vector<std::string>{f->output});
    std::vector<uint16_t> tokens;
    std::vector<int64_t> document_tokens;
    for (const auto& path : f->inputs) {
      const size_t before = tokens.size();
      append_bytes(path, tokens);
      document_tokens.push_back(static_cast<int64_t>(tokens.size() - before));
    }
    if (megatron) {
      const std::vector<int32_t> ids(tokens.begin(), tokens.end());
      train::write_megatron_dataset(prefix, ids, document_tokens, kByteVocab);
      fmt::print(stderr,
                 "wrote {} byte-level tokens from {} file(s) to {}.bin + {}.idx (Megatron-LM "
                 "indexed dataset, one document per file, uint16)\n",
                 tokens.size(), f->inputs.size(), prefix, prefix);
      return;
    }
    if (tokens.size() > 0x7fffffffu)
      fail("{} tokens do not fit one llm.c shard (at most 2^31 - 1): use --format megatron",
           tokens.size());
    train::write_token_file(f->output, tokens);
    fmt::print(stderr, "wrote {} byte-level tokens from {} file(s) to {}\n", tokens.size(),
               f->inputs.size(), f->output);
  });
}

}  // namespace mt::cli

// `meshtrain prepare TEXT... -o out.bin`: UTF-8 text to byte-level tokens (vocab 256) in
// llm.c's token-file format.
#include <fmt/format.h>

#include <fstream>
#include <iterator>
#include <memory>

#include "cli/commands.h"
#include "core/error.h"
#include "train/token_file.h"

namespace mt::cli {

void register_prepare(CLI::App& app) {
  struct Flags {
    std::vector<std::string> inputs;
    std::string output;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* cmd =
      app.add_subcommand("prepare", "turn UTF-8 text into byte-level tokens (vocab 256)");
  cmd->add_option("text", f->inputs, "text files, concatenated in order")->required();
  cmd->add_option("-o,--output", f->output, "token file to write (llm.c format)")->required();
  cmd->callback([f] {
    std::vector<uint16_t> tokens;
    for (const auto& path : f->inputs) {
      std::ifstream in(path, std::ios::binary);
      if (!in) fail("cannot read text file '{}'", path);
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      for (unsigned char ch : text) tokens.push_back(ch);
    }
    if (tokens.size() > 0x7fffffffu)
      fail("{} tokens do not fit one llm.c shard (at most 2^31 - 1)", tokens.size());
    train::write_token_file(f->output, tokens);
    fmt::print(stderr, "wrote {} byte-level tokens from {} file(s) to {}\n", tokens.size(),
               f->inputs.size(), f->output);
  });
}

}  // namespace mt::cli

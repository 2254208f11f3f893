// The llm.c token file reader (train/token_file.h): the 1024-byte header (magic, version,
// token count) and the uint16 tokens, checked against the model's vocabulary; then every
// token read back through the sampler, as training and eval read them. Only the public API
// that the reader's callers use, so that the harness outlives a change of its insides.
#include <vector>

#include "fuzz.h"
#include "train/token_corpus.h"

using namespace mt;

MT_FUZZ_TARGET(token_file) {
  const std::string path = fuzz::write_input("tokens.bin", bytes);
  // The vocabulary from the input's last byte: byte-level (256), GPT-2's (50257), the
  // format's limit (65536) or 1, so that both accepted and refused token ids are reached.
  static constexpr int64_t kVocabs[] = {256, 50257, 65536, 1};
  const int64_t vocab = kVocabs[bytes.empty() ? 0 : static_cast<uint8_t>(bytes.back()) % 4];
  fuzz::read_or_refuse(path, [&] {
    const train::TokenFile f(path, vocab);
    const int64_t n = f.num_tokens();
    if (2 * n + 1024 != static_cast<int64_t>(bytes.size()))
      throw fuzz::Bug("the token count disagrees with the file's size");
    if (n < 2) return;
    // Samples of T = 1: sample j is tokens [j, j + 2), so n - 1 samples read every token.
    const train::SequenceSampler s(f, 1, 0, n - 1);
    std::vector<int32_t> in(static_cast<size_t>(n - 1)), target(static_cast<size_t>(n - 1));
    s.fill(0, n - 1, in.data(), target.data());
    for (int64_t i = 0; i + 1 < n; ++i)
      if (in[i] < 0 || in[i] >= vocab || target[i] < 0 || target[i] >= vocab)
        throw fuzz::Bug("a token outside [0, vocab) was read");
  });
}

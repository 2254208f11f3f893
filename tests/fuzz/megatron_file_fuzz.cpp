// The Megatron-LM indexed dataset reader (train/token_file.h: PREFIX.idx + PREFIX.bin): the
// index's header (magic, version, dtype code, sequence and document counts), its arrays
// (lengths, pointers, document indices) against both files' sizes, every token against the
// vocabulary; then every token read back through the sampler, as training and eval read
// them. Opened as `train --data NAME` and `eval --data NAME` open it: a TokenCorpus of the
// one name (train/token_corpus.h), format auto.
//
// The input is both files, after a 4-byte header: the .idx's length (uint16, little-endian;
// clamped to what follows), the vocabulary (a byte, below) and how the pair is named (a byte:
// PREFIX, PREFIX.idx or PREFIX.bin); then the .idx, then the .bin (the rest).
#include <cstring>
#include <vector>

#include "fuzz.h"
#include "train/token_corpus.h"

using namespace mt;

MT_FUZZ_TARGET(megatron_file) {
  if (bytes.size() < 4) return;
  uint16_t idx_bytes = 0;
  std::memcpy(&idx_bytes, bytes.data(), 2);
  // Byte-level (256), GPT-2's (50257), uint16's limit (65536), Llama 3's (128256, int32
  // tokens), 1, and the largest meshtrain takes (2^31): accepted and refused ids of every dtype.
  static constexpr int64_t kVocabs[] = {256, 50257, 65536, 128256, 1, int64_t{1} << 31};
  const int64_t vocab = kVocabs[static_cast<uint8_t>(bytes[2]) % 6];
  const int name_form = static_cast<uint8_t>(bytes[3]) % 3;
  const std::string_view rest = bytes.substr(4);
  const std::string_view idx = rest.substr(0, idx_bytes), bin = rest.substr(idx.size());

  const std::string prefix = (fuzz::scratch_dir() / "data").string();
  fuzz::write_file(prefix + ".idx", idx);
  fuzz::write_file(prefix + ".bin", bin);
  const std::string path = name_form == 0 ? prefix : prefix + (name_form == 1 ? ".idx" : ".bin");

  // A refusal names the .idx or the .bin: both start with the prefix.
  fuzz::read_or_refuse(prefix, [&] {
    const train::TokenCorpus corpus(path, vocab);
    if (corpus.num_files() != 1) throw fuzz::Bug("one name opened as several files");
    const train::TokenFile& f = corpus.file(0);
    if (f.format() != train::TokenFormat::kMegatron)
      throw fuzz::Bug("a Megatron-LM pair was read as an llm.c file");
    const int64_t n = corpus.num_tokens();
    if (n * f.token_bytes() != static_cast<int64_t>(bin.size()))
      throw fuzz::Bug("the token count disagrees with the .bin's size");
    // Megatron-LM's dtype codes 1-5 and 8 (integers) are read; the byte at 17 is the code.
    static constexpr int kBytesOfCode[] = {0, 1, 1, 2, 4, 8, 0, 0, 2};
    const auto code = static_cast<uint8_t>(idx[17]);
    if (code > 8 || kBytesOfCode[code] != f.token_bytes())
      throw fuzz::Bug("the token width disagrees with the index's dtype code");
    if (n < 2) return;
    // Samples of T = 1: sample j is tokens [j, j + 2), so n - 1 samples read every token.
    const train::SequenceSampler s(corpus, 1, 0, n - 1);
    std::vector<int32_t> in(static_cast<size_t>(n - 1)), target(static_cast<size_t>(n - 1));
    s.fill(0, n - 1, in.data(), target.data());
    for (int64_t i = 0; i + 1 < n; ++i)
      if (in[i] < 0 || in[i] >= vocab || target[i] < 0 || target[i] >= vocab)
        throw fuzz::Bug("a token outside [0, vocab) was read");
  });
}

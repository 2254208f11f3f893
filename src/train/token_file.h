// Token shards in llm.c's format: a header of 256 int32 (magic 20240520, version 1,
// token count, the rest 0) followed by the tokens as uint16. Data prepared for llm.c or
// nanoGPT works as is.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mt::train {

constexpr int32_t kTokenFileMagic = 20240520;
constexpr int32_t kTokenFileVersion = 1;
constexpr int kTokenFileHeaderInts = 256;

class TokenFile {
 public:
  // Reads and validates the whole file; refuses a bad header, a truncated file, or a token
  // id >= vocab, naming the file, the position and the fix.
  TokenFile(const std::string& path, int64_t vocab);
  const std::string& path() const { return path_; }
  int64_t num_tokens() const { return static_cast<int64_t>(tokens_.size()); }
  const uint16_t* tokens() const { return tokens_.data(); }

 private:
  std::string path_;
  std::vector<uint16_t> tokens_;
};

// Writes tokens in llm.c's format, atomically (temporary name, then rename); a failed write
// removes the temporary file.
void write_token_file(const std::string& path, const std::vector<uint16_t>& tokens);

// Sequences of T+1 tokens by global sample index: sample j reads tokens
// [j*T, j*T + T + 1) of its split, so a batch of B consecutive samples starting at
// k*B is exactly llm.c's batch k. The order of samples depends only on the global
// index (layout independence).
class SequenceSampler {
 public:
  // Samples [first_sample, first_sample + num_samples) of the file; wraps around.
  SequenceSampler(const TokenFile& file, int64_t T, int64_t first_sample, int64_t num_samples);
  int64_t num_samples() const { return num_samples_; }
  // Fills inputs and targets ([n, T] each) with samples global_index .. global_index+n-1.
  void fill(int64_t global_index, int64_t n, int32_t* inputs, int32_t* targets) const;

 private:
  const TokenFile* file_;
  int64_t T_, first_, num_samples_;
};

}  // namespace mt::train

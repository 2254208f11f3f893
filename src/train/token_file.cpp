#include "train/token_file.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace mt::train {

namespace {
// Names the file's largest token, not just the first one out of range: the suggested
// --vocab then works at the first retry (the scan runs only on this error path).
[[noreturn]] void refuse_vocab(const std::string& path, const std::vector<uint16_t>& tokens,
                               int64_t first_bad, int64_t vocab) {
  const uint16_t largest = *std::max_element(tokens.begin(), tokens.end());
  fail(
      "data file '{}': token {} at position {} is >= the model's vocab {}; the largest token "
      "in the file is {}: use --vocab {} or more, or data made for this vocabulary",
      path, tokens[static_cast<size_t>(first_bad)], first_bad, vocab, largest, largest + 1);
}
}  // namespace

TokenFile::TokenFile(const std::string& path, int64_t vocab) : path_(path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open data file '{}' (check the path; `meshtrain prepare` makes one)", path);
  std::array<int32_t, kTokenFileHeaderInts> header{};
  in.read(reinterpret_cast<char*>(header.data()), sizeof(header));
  if (in.gcount() != static_cast<std::streamsize>(sizeof(header)))
    fail("data file '{}' is shorter than its 1024-byte header: not an llm.c token file", path);
  if (header[0] != kTokenFileMagic)
    fail(
        "data file '{}' has magic {} instead of {}: not an llm.c token file (make one with "
        "`meshtrain prepare`)",
        path, header[0], kTokenFileMagic);
  if (header[1] != kTokenFileVersion)
    fail("data file '{}' has version {}; only version {} (uint16 tokens) is supported", path,
         header[1], kTokenFileVersion);
  const int64_t count = header[2];
  const auto file_bytes = static_cast<int64_t>(std::filesystem::file_size(path));
  const int64_t expected = static_cast<int64_t>(sizeof(header)) + 2 * count;
  if (count < 0 || file_bytes != expected)
    fail(
        "data file '{}' is damaged: its header says {} tokens ({} bytes) but the file has {} "
        "bytes",
        path, count, expected, file_bytes);
  tokens_.resize(static_cast<size_t>(count));
  in.read(reinterpret_cast<char*>(tokens_.data()), 2 * count);
  for (int64_t i = 0; i < count; ++i)
    if (tokens_[i] >= vocab) refuse_vocab(path, tokens_, i, vocab);
}

void write_token_file(const std::string& path, const std::vector<uint16_t>& tokens) {
  std::array<int32_t, kTokenFileHeaderInts> header{};
  header[0] = kTokenFileMagic;
  header[1] = kTokenFileVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  const std::string tmp = path + ".tmp";
  try {
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      if (!out)
        fail("cannot write '{}' (via '{}'): does the directory exist and is it writable?", path,
             tmp);
      out.write(reinterpret_cast<const char*>(header.data()), sizeof(header));
      out.write(reinterpret_cast<const char*>(tokens.data()),
                static_cast<std::streamsize>(2 * tokens.size()));
      if (!out) fail_run("writing '{}' failed (disk full?)", tmp);
    }
    std::filesystem::rename(tmp, path);
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);  // no half-written file left behind
    throw;
  }
}

SequenceSampler::SequenceSampler(const TokenFile& file, int64_t T, int64_t first_sample,
                                 int64_t num_samples)
    : file_(&file), T_(T), first_(first_sample), num_samples_(num_samples) {
  if (num_samples < 1)
    fail(
        "data file '{}' has {} tokens: too few for one sequence of {} + 1 tokens (use a "
        "shorter --seq or more data)",
        file.path(), file.num_tokens(), T);
  MT_ASSERT((first_ + num_samples_) * T_ + 1 <= file.num_tokens());
}

void SequenceSampler::fill(int64_t global_index, int64_t n, int32_t* inputs,
                           int32_t* targets) const {
  for (int64_t s = 0; s < n; ++s) {
    const int64_t j = first_ + (global_index + s) % num_samples_;
    const uint16_t* src = file_->tokens() + j * T_;
    for (int64_t t = 0; t < T_; ++t) {
      inputs[s * T_ + t] = src[t];
      targets[s * T_ + t] = src[t + 1];
    }
  }
}

}  // namespace mt::train

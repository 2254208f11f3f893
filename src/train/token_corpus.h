// A training corpus: one or more token files (train/token_file.h, any mix of llm.c,
// nanoGPT and Megatron-LM data) read as one token stream, in the order given, and the
// sampler that cuts it into sequences by global sample index (docs/data.md).
//
// `--data` names the files: a comma-separated list, each entry a path or a glob
// (llm.c's shard lists: `fineweb_train_*.bin`), a glob's matches in sorted order.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "train/sample_order.h"
#include "train/token_file.h"

namespace mt::train {

// The paths a --data value names, in order: its comma-separated entries, each glob expanded
// (sorted; a Megatron-LM pair whose .bin and .idx both match counts once). Refuses an empty
// entry and a glob that matches nothing, naming it.
std::vector<std::string> expand_data_paths(const std::string& spec, DataFormat format);

class TokenCorpus {
 public:
  // Opens every file that `spec` names (expand_data_paths), each checked as TokenFile does.
  TokenCorpus(const std::string& spec, int64_t vocab, DataFormat format = DataFormat::kAuto);
  // One file opened elsewhere, not owned (it must outlive the corpus).
  explicit TokenCorpus(const TokenFile& file);

  const std::string& spec() const { return spec_; }
  size_t num_files() const { return files_.size(); }
  const TokenFile& file(size_t i) const { return *files_[i]; }
  int64_t num_tokens() const { return num_tokens_; }
  // "3 files (llm.c), 1234567 tokens" or, for one file, its format.
  std::string describe() const;

  // Tokens [first, first + count) of the stream, across file boundaries, as int32 (each
  // checked against the vocab again, as TokenFile::read does).
  void read(int64_t first, int64_t count, int32_t* out) const;

 private:
  std::string spec_;
  std::vector<std::unique_ptr<TokenFile>> owned_;
  std::vector<const TokenFile*> files_;
  std::vector<int64_t> starts_;  // the stream position of each file's first token
  int64_t num_tokens_ = 0;
};

// Sequences of T+1 tokens by global sample index: sample j reads tokens
// [j*T, j*T + T + 1) of its split. In file order (SampleOrder::shuffle false) a batch of B
// consecutive global indices starting at k*B is exactly llm.c's batch k; shuffled, global
// index g reads sample order.sample(g, num_samples), a permutation per epoch. Either way the
// sample depends only on the global index (layout independence).
class SequenceSampler {
 public:
  // Samples [first_sample, first_sample + num_samples) of the corpus; the index wraps around
  // (each pass an epoch).
  SequenceSampler(const TokenCorpus& corpus, int64_t T, int64_t first_sample, int64_t num_samples,
                  SampleOrder order = {});
  // One file, in file order.
  SequenceSampler(const TokenFile& file, int64_t T, int64_t first_sample, int64_t num_samples);
  int64_t num_samples() const { return num_samples_; }
  const SampleOrder& order() const { return order_; }
  // The split's sample (in [0, num_samples)) that global index g reads.
  int64_t sample_of(int64_t g) const { return order_.sample(g, num_samples_); }
  // Fills inputs and targets ([n, T] each) with global indices global_index .. + n - 1.
  void fill(int64_t global_index, int64_t n, int32_t* inputs, int32_t* targets) const;

  // Tests: called (from whichever rank thread reads) with every global index that fill()
  // reads and the split's sample it maps to, so that a test can check that every layout
  // reads the same samples. nullptr (the default) turns it off.
  using FillObserver = void (*)(const SequenceSampler& sampler, int64_t global_index,
                                int64_t sample);
  static void set_fill_observer(FillObserver observer);

 private:
  void check() const;
  std::unique_ptr<TokenCorpus> own_;  // the one-file constructor's view
  const TokenCorpus* corpus_;
  int64_t T_, first_, num_samples_;
  SampleOrder order_;
};

}  // namespace mt::train

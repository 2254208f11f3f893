#include "train/token_corpus.h"

#include <glob.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <set>

#include "core/error.h"

namespace mt::train {

namespace {

namespace fs = std::filesystem;

bool is_glob(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The files a glob matches, sorted (glob(3) sorts them), folders left out.
std::vector<std::string> glob_files(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) {
      std::error_code ec;
      if (!fs::is_directory(g.gl_pathv[i], ec)) out.emplace_back(g.gl_pathv[i]);
    }
  ::globfree(&g);
  if (rc != 0 && rc != GLOB_NOMATCH) fail("--data: cannot read the files of '{}'", pattern);
  return out;
}

}  // namespace

std::vector<std::string> expand_data_paths(const std::string& spec, DataFormat format) {
  if (spec.empty()) fail("--data is empty: name a token file (make one with `meshtrain prepare`)");
  std::vector<std::string> paths;
  size_t at = 0;
  while (true) {
    const size_t comma = spec.find(',', at);
    const std::string entry = spec.substr(at, comma == std::string::npos ? comma : comma - at);
    if (entry.empty())
      fail("--data '{}' has an empty entry: separate the files by single commas (a.bin,b.bin)",
           spec);
    if (!is_glob(entry)) {
      paths.push_back(entry);
    } else {
      const std::vector<std::string> matches = glob_files(entry);
      if (matches.empty())
        fail("--data: '{}' matches no file (check the folder and the pattern)", entry);
      // A Megatron-LM pair is one data set: its .bin and .idx matching both count once.
      std::set<std::string> pairs;
      for (const std::string& m : matches) {
        const bool half = ends_with(m, ".bin") || ends_with(m, ".idx");
        const std::string prefix = half ? megatron_prefix(m) : m;
        std::error_code ec;
        const bool pair = half && format != DataFormat::kLlmc && format != DataFormat::kNanoGpt &&
                          fs::exists(prefix + ".bin", ec) && fs::exists(prefix + ".idx", ec);
        if (pair && !pairs.insert(prefix).second) continue;
        paths.push_back(pair ? prefix : m);
      }
    }
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return paths;
}

TokenCorpus::TokenCorpus(const std::string& spec, int64_t vocab, DataFormat format) : spec_(spec) {
  for (const std::string& path : expand_data_paths(spec, format)) {
    owned_.push_back(std::make_unique<TokenFile>(path, vocab, format));
    files_.push_back(owned_.back().get());
  }
  for (const TokenFile* f : files_) {
    starts_.push_back(num_tokens_);
    num_tokens_ += f->num_tokens();
  }
}

TokenCorpus::TokenCorpus(const TokenFile& file) : spec_(file.path()) {
  files_.push_back(&file);
  starts_.push_back(0);
  num_tokens_ = file.num_tokens();
}

std::string TokenCorpus::describe() const {
  std::set<std::string> formats;
  for (const TokenFile* f : files_) formats.insert(token_format_name(f->format()));
  std::string names;
  for (const std::string& n : formats) names += (names.empty() ? "" : ", ") + n;
  if (files_.size() == 1) return fmt::format("{}, {} tokens", names, num_tokens_);
  return fmt::format("{} files ({}), {} tokens", files_.size(), names, num_tokens_);
}

void TokenCorpus::read(int64_t first, int64_t count, int32_t* out) const {
  MT_ASSERT(first >= 0 && count >= 0 && first <= num_tokens_ - count);
  // The file holding `first`: the last one starting at or before it (empty files skipped).
  size_t k = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), first) -
                                 starts_.begin()) -
             1;
  while (count > 0) {
    const int64_t local = first - starts_[k];
    const int64_t n = std::min(count, files_[k]->num_tokens() - local);
    if (n > 0) files_[k]->read(local, n, out);
    first += n;
    count -= n;
    out += n;
    ++k;
  }
}

SequenceSampler::SequenceSampler(const TokenCorpus& corpus, int64_t T, int64_t first_sample,
                                 int64_t num_samples, SampleOrder order)
    : corpus_(&corpus), T_(T), first_(first_sample), num_samples_(num_samples), order_(order) {
  check();
}

SequenceSampler::SequenceSampler(const TokenFile& file, int64_t T, int64_t first_sample,
                                 int64_t num_samples)
    : own_(std::make_unique<TokenCorpus>(file)),
      corpus_(own_.get()),
      T_(T),
      first_(first_sample),
      num_samples_(num_samples) {
  check();
}

void SequenceSampler::check() const {
  if (num_samples_ < 1)
    fail(
        "data '{}' has {} tokens: too few for one sequence of {} + 1 tokens (use a shorter "
        "--seq or more data)",
        corpus_->spec(), corpus_->num_tokens(), T_);
  MT_ASSERT((first_ + num_samples_) * T_ + 1 <= corpus_->num_tokens());
}

namespace {
std::atomic<SequenceSampler::FillObserver> g_fill_observer{nullptr};
}  // namespace

void SequenceSampler::set_fill_observer(FillObserver observer) { g_fill_observer = observer; }

void SequenceSampler::fill(int64_t global_index, int64_t n, int32_t* inputs,
                           int32_t* targets) const {
  const FillObserver observe = g_fill_observer.load(std::memory_order_relaxed);
  for (int64_t s = 0; s < n; ++s) {
    const int64_t sample = sample_of(global_index + s);
    if (observe) observe(*this, global_index + s, sample);
    const int64_t j = first_ + sample;
    corpus_->read(j * T_, T_, inputs + s * T_);
    corpus_->read(j * T_ + 1, T_, targets + s * T_);
  }
}

}  // namespace mt::train

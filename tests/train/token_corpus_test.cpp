// A corpus of several token files (train/token_corpus.h): a comma-separated list and globs
// read as one stream in order, any mix of llm.c and Megatron-LM data, nanoGPT's headerless
// uint16 files when named by --data-format, and the refusals: a folder, an empty entry, a
// glob that matches nothing, a headerless file in auto mode.
#include "train/token_corpus.h"

#include <gtest/gtest.h>

#include <fstream>
#include <numeric>

#include "core/error.h"
#include "test_util.h"

namespace mt::train {
namespace {

namespace fs = std::filesystem;

std::vector<uint16_t> iota16(uint16_t first, size_t n) {
  std::vector<uint16_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

std::vector<int32_t> read_all(const TokenCorpus& c) {
  std::vector<int32_t> out(static_cast<size_t>(c.num_tokens()));
  c.read(0, c.num_tokens(), out.data());
  return out;
}

std::vector<int32_t> as_int(const std::vector<uint16_t>& v) { return {v.begin(), v.end()}; }

void write_raw(const fs::path& p, const std::vector<uint16_t>& v) {
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(2 * v.size()));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput);
    return e.what();
  }
  ADD_FAILURE() << "not refused";
  return {};
}

class Corpus : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::scratch_dir("corpus");
    write_token_file((dir_ / "shard_000.bin").string(), a_);
    write_token_file((dir_ / "shard_001.bin").string(), b_);
    write_token_file((dir_ / "shard_002.bin").string(), c_);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
  const std::vector<uint16_t> a_ = iota16(0, 10), b_ = iota16(100, 7), c_ = iota16(200, 5);
};

TEST_F(Corpus, AListIsOneStreamInTheOrderGiven) {
  const TokenCorpus c(path("shard_002.bin") + "," + path("shard_000.bin"), 256);
  EXPECT_EQ(c.num_files(), 2u);
  std::vector<int32_t> want = as_int(c_);
  for (uint16_t t : a_) want.push_back(t);
  EXPECT_EQ(read_all(c), want);
  // A read across the boundary: the last 2 tokens of the first file and 3 of the second.
  std::vector<int32_t> part(5);
  c.read(3, 5, part.data());
  EXPECT_EQ(part, (std::vector<int32_t>{203, 204, 0, 1, 2}));
  EXPECT_EQ(c.describe(), "2 files (llm.c), 15 tokens");
}

TEST_F(Corpus, AGlobIsItsMatchesSorted) {
  const TokenCorpus c(path("shard_*.bin"), 256);
  std::vector<int32_t> want = as_int(a_);
  for (uint16_t t : b_) want.push_back(t);
  for (uint16_t t : c_) want.push_back(t);
  EXPECT_EQ(read_all(c), want);
}

TEST_F(Corpus, SamplesSpanFilesAndShuffleAsAPermutation) {
  const TokenCorpus c(path("shard_*.bin"), 256);  // 22 tokens: 5 samples of T = 4
  const SequenceSampler s(c, 4, 0, 5);
  std::vector<int32_t> in(4), tgt(4);
  s.fill(2, 1, in.data(), tgt.data());  // tokens [8, 13): 8 9 | 100 101 102
  EXPECT_EQ(in, (std::vector<int32_t>{8, 9, 100, 101}));
  EXPECT_EQ(tgt, (std::vector<int32_t>{9, 100, 101, 102}));
  const SequenceSampler shuffled(c, 4, 0, 5, SampleOrder{true, 7});
  std::vector<int64_t> seen;
  for (int64_t g = 0; g < 5; ++g) seen.push_back(shuffled.sample_of(g));
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  // Sample k reads the same tokens whatever global index asks for it.
  for (int64_t g = 0; g < 5; ++g) {
    std::vector<int32_t> x(4), y(4), x0(4), y0(4);
    shuffled.fill(g, 1, x.data(), y.data());
    s.fill(shuffled.sample_of(g), 1, x0.data(), y0.data());
    EXPECT_EQ(x, x0) << g;
    EXPECT_EQ(y, y0) << g;
  }
}

TEST_F(Corpus, MegatronAndLlmcMixAndAPairMatchedTwiceCountsOnce) {
  write_megatron_dataset(path("meg"), std::vector<int32_t>{50, 51, 52}, std::vector<int64_t>{3},
                         256);
  // "meg*" matches meg.bin and meg.idx: one data set.
  const TokenCorpus c(path("shard_000.bin") + "," + path("meg*"), 256);
  EXPECT_EQ(c.num_files(), 2u);
  std::vector<int32_t> want = as_int(a_);
  for (int32_t t : {50, 51, 52}) want.push_back(t);
  EXPECT_EQ(read_all(c), want);
  EXPECT_EQ(c.describe(), "2 files (Megatron-LM, llm.c), 13 tokens");
}

TEST_F(Corpus, NanoGptFilesAreReadWhenNamedAndRefusedInAuto) {
  const std::vector<uint16_t> tokens = {15496, 11, 995, 50256};  // GPT-2 ids, no header
  write_raw(dir_ / "train.bin", tokens);
  const TokenCorpus c(path("train.bin"), 50257, DataFormat::kNanoGpt);
  EXPECT_EQ(read_all(c), as_int(tokens));
  EXPECT_EQ(c.file(0).format(), TokenFormat::kNanoGpt);
  // auto: a file without a header could be anything: refused, naming the flag.
  const std::string e = error_of([&] { TokenCorpus(path("train.bin"), 50257); });
  EXPECT_NE(e.find("--data-format nanogpt"), std::string::npos) << e;
  // nanogpt on an llm.c file, and an odd size, are refused.
  EXPECT_NE(error_of([&] {
              TokenCorpus(path("shard_000.bin"), 256, DataFormat::kNanoGpt);
            }).find("it is an llm.c token file"),
            std::string::npos);
  std::ofstream(dir_ / "odd.bin") << "abc";
  EXPECT_NE(error_of([&] {
              TokenCorpus(path("odd.bin"), 256, DataFormat::kNanoGpt);
            }).find("an odd number"),
            std::string::npos);
  EXPECT_EQ(parse_data_format("megatron"), DataFormat::kMegatron);
  EXPECT_NE(error_of([] { parse_data_format("hf"); }).find("choose auto, llmc, nanogpt"),
            std::string::npos);
}

TEST_F(Corpus, RefusesAFolderAnEmptyEntryAndAGlobThatMatchesNothing) {
  EXPECT_NE(error_of([&] { TokenCorpus(dir_.string(), 256); }).find("is a folder"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] { TokenCorpus(path("shard_000.bin") + ",", 256); }).find("has an empty entry"),
      std::string::npos);
  EXPECT_NE(error_of([&] { TokenCorpus(path("nothing_*.bin"), 256); }).find("matches no file"),
            std::string::npos);
}

}  // namespace
}  // namespace mt::train

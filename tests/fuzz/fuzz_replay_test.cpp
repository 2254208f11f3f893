// Every fuzz harness (tests/fuzz/*_fuzz.cpp) over every file of its seed corpus
// (tests/fuzz/corpus/READER/): in every build, so the harnesses compile and the readers
// keep refusing the near-misses properly (and, under `make sanitize`, without a sanitizer
// report). The fuzzing itself is scripts/fuzz.sh (docs/fuzzing.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "fuzz.h"

namespace mt::fuzz {
namespace {

namespace fs = std::filesystem;

const fs::path kCorpus = fs::path(MT_SOURCE_DIR) / "tests" / "fuzz" / "corpus";

std::vector<fs::path> files_in(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(FuzzReplay, EveryHarnessHasASeedCorpusAndEveryCorpusAHarness) {
  // The readers of outside files (docs/fuzzing.md), each a harness linked into this test.
  for (const char* reader :
       {"safetensors", "safetensors_shards", "hf_weights", "hf_llama", "checkpoint_index",
        "config_file", "cluster_file", "token_file", "megatron_file"})
    EXPECT_TRUE(targets().count(reader)) << "no harness tests/fuzz/" << reader << "_fuzz.cpp";
  for (const auto& [name, fn] : targets()) {
    EXPECT_TRUE(fs::is_directory(kCorpus / name)) << "no seed corpus tests/fuzz/corpus/" << name;
    if (fs::is_directory(kCorpus / name)) {
      EXPECT_FALSE(files_in(kCorpus / name).empty()) << name;
    }
  }
  for (const auto& e : fs::directory_iterator(kCorpus))
    EXPECT_TRUE(targets().count(e.path().filename().string()))
        << "corpus " << e.path() << " has no harness tests/fuzz/" << e.path().filename().string()
        << "_fuzz.cpp";
}

TEST(FuzzReplay, SeedCorporaAreReadOrRefusedProperly) {
  for (const auto& [name, fn] : targets()) {
    if (!fs::is_directory(kCorpus / name)) continue;
    for (const fs::path& file : files_in(kCorpus / name)) {
      const std::string bytes = read_all(file);
      try {
        fn(bytes);
      } catch (const std::exception& e) {
        ADD_FAILURE() << name << " on " << file.filename() << ": " << e.what();
      }
    }
  }
}

}  // namespace
}  // namespace mt::fuzz

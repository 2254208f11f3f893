// Damaged or foreign token data is refused with the file and the reason, never read past its
// end: each size, count and pointer of a Megatron-LM index or an llm.c header is checked against
// the files' real sizes before it is used.
#include <gtest/gtest.h>

#include <fstream>

#include "core/error.h"
#include "test_util.h"
#include "train/token_file.h"

namespace mt::train {
namespace {

namespace fs = std::filesystem;

struct Bytes {
  std::string s;
  template <typename T>
  Bytes& put(T v) {
    s.append(reinterpret_cast<const char*>(&v), sizeof(T));
    return *this;
  }
  template <typename T>
  Bytes& put_all(const std::vector<T>& v) {
    for (const T& x : v) put(x);
    return *this;
  }
};

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Megatron-LM's .idx layout (megatron/core/datasets/indexed_dataset.py, _IndexWriter), with
// every header field settable so that a test can lie in it.
struct Index {
  std::string magic = std::string("MMIDIDX\0\0", 9);
  uint64_t version = 1;
  uint8_t code = 4;  // int32
  std::vector<int32_t> lengths = {3, 4, 2};
  std::vector<int64_t> pointers = {0, 12, 28};
  std::vector<int64_t> documents = {0, 2, 3};  // 2 documents: sequences {0, 1} and {2}
  uint64_t sequences() const { return lengths.size(); }
  std::string bytes(uint64_t sequence_count, uint64_t document_count) const {
    Bytes b;
    b.s = magic;
    b.put(version).put(code).put(sequence_count).put(document_count);
    return b.put_all(lengths).put_all(pointers).put_all(documents).s;
  }
  std::string bytes() const { return bytes(lengths.size(), documents.size()); }
};

const std::vector<int32_t> kTokens = {10, 11, 12, 13, 14, 15, 16, 17, 18};

class TokenDataFault : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::scratch_dir("token-fault");
    prefix_ = (dir_ / "d").string();
  }
  void write(const Index& index, const std::string& bin) {
    write_bytes(prefix_ + ".idx", index.bytes());
    write_bytes(prefix_ + ".bin", bin);
  }
  void write(const Index& index) { write(index, Bytes().put_all(kTokens).s); }
  // The message of the refusal (exit code 2: bad input); "no error" when accepted.
  std::string refusal(const std::string& path, int64_t vocab = 100) {
    try {
      TokenFile f(path, vocab);
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), 2) << e.what();
      return e.what();
    }
    return "no error";
  }
  void expect_refused(const std::string& says, int64_t vocab = 100) {
    const std::string m = refusal(prefix_, vocab);
    EXPECT_NE(m.find(says), std::string::npos) << m;
  }
  fs::path dir_;
  std::string prefix_;
};

TEST_F(TokenDataFault, TheBaseDatasetIsAccepted) {
  write(Index{});
  EXPECT_EQ(refusal(prefix_), "no error");
}

TEST_F(TokenDataFault, TokenPastTheVocabIsRefusedWithItsPosition) {
  std::vector<int32_t> tokens = kTokens;
  tokens[5] = 128256;  // sequence 1 (tokens 3..6), document 0
  write(Index{}, Bytes().put_all(tokens).s);
  const std::string m = refusal(prefix_, 128256);
  EXPECT_NE(m.find("data file '" + prefix_ +
                   ".bin': token 128256 at position 5 (document 0 of 2, sequence 1) is >= the "
                   "model's vocab 128256; the largest token in the file is 128256: use --vocab "
                   "128257 or more"),
            std::string::npos)
      << m;
  tokens[5] = -3;
  write(Index{}, Bytes().put_all(tokens).s);
  EXPECT_NE(refusal(prefix_).find("token -3 at position 5 (document 0 of 2, sequence 1) is "
                                  "negative"),
            std::string::npos);
}

// read() checks again: the file may change under a running job (it is mapped, not copied).
TEST_F(TokenDataFault, ReadRefusesATokenThatChangedAfterOpening) {
  write(Index{});
  const TokenFile f(prefix_, 100);
  std::vector<int32_t> out(9);
  f.read(0, 9, out.data());
  EXPECT_EQ(out, kTokens);
  {
    std::fstream bin(prefix_ + ".bin", std::ios::binary | std::ios::in | std::ios::out);
    bin.seekp(4 * 7);
    const int32_t bad = 4000;
    bin.write(reinterpret_cast<const char*>(&bad), 4);
  }
  try {
    f.read(6, 3, out.data());
    FAIL() << "read() returned a token past the vocab";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token 4000 at position 7 (document 1 of 2, sequence 2) "
                                         "is >= the model's vocab 100"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(TokenDataFault, BadMagicVersionOrDtypeIsRefused) {
  Index index;
  index.magic = std::string("MMIDIDY\0\0", 9);
  write(index);
  expect_refused("Megatron-LM index file '" + prefix_ +
                 ".idx' starts with \"MMIDIDY\\x00\\x00\" instead of the magic");
  expect_refused("Megatron-LM indexed datasets (PREFIX.idx + PREFIX.bin");  // what is accepted
  index = Index{};
  index.version = 2;
  write(index);
  expect_refused("has version 2; only version 1 is supported");
  index = Index{};
  index.code = 7;
  write(index);
  expect_refused("holds float32 values (dtype code 7), not token ids");
  index.code = 6;
  write(index);
  expect_refused("holds float64 values (dtype code 6), not token ids");
  index.code = 9;
  write(index);
  expect_refused("has the unknown dtype code 9");
}

TEST_F(TokenDataFault, TruncatedIndexIsRefused) {
  const Index index;
  const std::string whole = index.bytes();
  write_bytes(prefix_ + ".bin", Bytes().put_all(kTokens).s);
  write_bytes(prefix_ + ".idx", whole.substr(0, whole.size() - 8));  // the last document index
  expect_refused("Megatron-LM index file '" + prefix_ +
                 ".idx' is truncated: its header says 3 sequences and 3 document indices, 94 "
                 "bytes in all, but the file has 86 bytes");
  write_bytes(prefix_ + ".idx", whole.substr(0, 20));
  expect_refused("is truncated: 20 bytes, less than its 34-byte header");
  // Counts no file could hold are refused by the size check, not allocated or read.
  write_bytes(prefix_ + ".idx", index.bytes(uint64_t{1} << 62, 3));
  expect_refused("is truncated: its header says 4611686018427387904 sequences");
  write_bytes(prefix_ + ".idx", index.bytes(3, ~uint64_t{0}));
  expect_refused("3 sequences and 18446744073709551615 document indices, more than 2^64 bytes");
  // Trailing bytes that are no multimodal modes: the counts understate the arrays.
  write_bytes(prefix_ + ".idx", index.bytes(3, 2));
  expect_refused("has 8 bytes after its arrays");
}

TEST_F(TokenDataFault, TruncatedOrLongerBinIsRefused) {
  const std::string bin = Bytes().put_all(kTokens).s;
  write(Index{}, bin.substr(0, bin.size() - 4));
  expect_refused("Megatron-LM data file '" + prefix_ + ".bin' is truncated: its index '" + prefix_ +
                 ".idx' lists 3 sequences of 9 tokens in all (36 bytes of int32) but the file has "
                 "32 bytes");
  write(Index{}, bin + "xxxx");
  expect_refused("has 40 bytes, but the lengths in its index");
}

TEST_F(TokenDataFault, PointersOutsideTheBinOrOutOfOrderAreRefused) {
  Index index;
  index.pointers = {0, 1000, 28};
  write(index);
  expect_refused("Megatron-LM index file '" + prefix_ +
                 ".idx': sequence 1 points to byte 1000 (16 bytes long), outside the data file '" +
                 prefix_ + ".bin' of 36 bytes");
  index.pointers = {0, -8, 28};
  write(index);
  expect_refused("sequence 1 points to byte -8");
  index.pointers = {0, 20, 12};  // inside the .bin, out of order
  write(index);
  expect_refused(
      "sequence 1 starts at byte 20, but the sequences before it end at byte 12: "
      "pointers out of order");
  index.pointers = {0, 12, 24};  // sequence 2 overlaps sequence 1
  write(index);
  expect_refused("sequence 2 starts at byte 24, but the sequences before it end at byte 28");
}

TEST_F(TokenDataFault, LengthsOrDocumentsThatDoNotAddUpAreRefused) {
  Index index;
  index.lengths = {3, -4, 2};
  write(index);
  expect_refused("gives sequence 1 the negative length -4");
  index = Index{};
  index.lengths = {3, 4, 3};  // 10 tokens listed, 9 in the .bin
  write(index);
  expect_refused("is truncated: its index '" + prefix_ + ".idx' lists 3 sequences of 10 tokens");
  index = Index{};
  index.documents = {0, 2, 2};
  write(index);
  expect_refused("the last document index is 2, not the sequence count 3");
  index.documents = {1, 2, 3};
  write(index);
  expect_refused("document index 0 is 1: the document indices must rise from 0");
  index.documents = {0, 3, 2};
  write(index);
  expect_refused("document index 2 is 2 after 3");
  index.documents = {0, 2, 7};
  write(index);
  expect_refused("document index 2 is 7 after 2");
  index.documents = {};
  write(index);
  expect_refused("has no document indices");
}

TEST_F(TokenDataFault, AMissingHalfOfThePairIsNamed) {
  write(Index{});
  fs::remove(prefix_ + ".bin");
  expect_refused("cannot open Megatron-LM data file '" + prefix_ + ".bin'");
  write(Index{});
  fs::remove(prefix_ + ".idx");  // d.bin alone, named by its prefix
  expect_refused("cannot open Megatron-LM index file '" + prefix_ + ".idx'");
  // Named as d.bin it is taken for an llm.c file, and the message says why it is not one.
  const std::string m = refusal(prefix_ + ".bin");
  EXPECT_NE(m.find("not an llm.c token file (nor half of a Megatron-LM dataset: there is no '" +
                   prefix_ + ".idx' beside it)"),
            std::string::npos)
      << m;
}

// llm.c: a header claiming 2^31 - 1 tokens over a file of a few is refused from the file's size,
// before a token is read (the file is mapped: nothing of the claimed size is allocated).
TEST_F(TokenDataFault, LlmcHeaderWithAHugeCountIsRefused) {
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = 1;
  header[2] = 0x7fffffff;
  const std::string path = (dir_ / "huge.bin").string();
  write_bytes(path, Bytes().put_all(header).put_all(std::vector<uint16_t>{1, 2, 3}).s);
  EXPECT_NE(refusal(path).find("data file '" + path +
                               "' is damaged: its header says 2147483647 tokens (4294968318 bytes) "
                               "but the file has 1030 bytes"),
            std::string::npos);
  header[2] = -5;
  write_bytes(path, Bytes().put_all(header).s);
  EXPECT_NE(refusal(path).find("header says -5 tokens"), std::string::npos);
  // Neither format: the message lists what is accepted.
  write_bytes(path, std::string(2000, 'x'));
  const std::string m = refusal(path);
  EXPECT_NE(m.find("has magic 2021161080 instead of 20240520: not an llm.c token file"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("meshtrain reads llm.c token files"), std::string::npos) << m;
}

}  // namespace
}  // namespace mt::train

// Token data in both formats reads back exactly: Megatron-LM indexed datasets written by
// `meshtrain prepare --format megatron` and, independently of our writer, byte by byte to
// Megatron-LM's layout (including int32 tokens past 65535); llm.c files keep working.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <numeric>

#include "core/error.h"
#include "test_util.h"
#include "train/token_corpus.h"

namespace mt::train {
namespace {

namespace fs = std::filesystem;

// Little-endian bytes, appended one value at a time.
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

std::string file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// An .idx as megatron/core/datasets/indexed_dataset.py's _IndexWriter writes it: the magic
// "MMIDIDX\0\0", <Q version 1, <B dtype code, <Q sequence count, <Q document-index count,
// int32 lengths, int64 byte pointers, int64 document indices (0, ..., sequence count).
std::string megatron_index(uint8_t code, const std::vector<int32_t>& lengths,
                           const std::vector<int64_t>& pointers,
                           const std::vector<int64_t>& documents) {
  Bytes b;
  b.s.append("MMIDIDX\0\0", 9);
  b.put<uint64_t>(1)
      .put<uint8_t>(code)
      .put<uint64_t>(lengths.size())
      .put<uint64_t>(documents.size());
  b.put_all(lengths).put_all(pointers).put_all(documents);
  return b.s;
}

std::vector<int32_t> read_all(const TokenFile& f) {
  std::vector<int32_t> out(static_cast<size_t>(f.num_tokens()));
  f.read(0, f.num_tokens(), out.data());
  return out;
}

TEST(MegatronData, PrepareWritesAPairThatReadsBackExactly) {
  const auto dir = test::scratch_dir("megatron-prepare");
  const std::string a = "hello, world\n", b = "\xce\xbb is a lambda";  // UTF-8: bytes, not chars
  std::ofstream(dir / "a.txt") << a;
  std::ofstream(dir / "b.txt") << b;
  const std::string prefix = (dir / "corpus").string();
  auto r = test::run_meshtrain("prepare " + (dir / "a.txt").string() + " " +
                               (dir / "b.txt").string() + " --format megatron -o " + prefix);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(prefix + ".bin"));
  EXPECT_TRUE(fs::exists(prefix + ".idx"));
  EXPECT_FALSE(fs::exists(prefix + ".bin.tmp"));
  EXPECT_FALSE(fs::exists(prefix + ".idx.tmp"));

  std::vector<int32_t> expected;
  for (unsigned char c : a + b) expected.push_back(c);
  // The pair is named by its prefix or by either file.
  for (const std::string& name : {prefix, prefix + ".bin", prefix + ".idx"}) {
    const TokenFile f(name, 256);
    EXPECT_EQ(f.format(), TokenFormat::kMegatron) << name;
    EXPECT_EQ(f.num_documents(), 2) << name;
    EXPECT_EQ(f.token_bytes(), 2) << name;  // uint16 for a vocabulary of 256, as Megatron-LM
    EXPECT_EQ(read_all(f), expected) << name;
  }

  // The index is Megatron-LM's layout, byte for byte: one sequence per document, uint16 (8).
  const auto na = static_cast<int32_t>(a.size()), nb = static_cast<int32_t>(b.size());
  EXPECT_EQ(file_bytes(prefix + ".idx"), megatron_index(8, {na, nb}, {0, 2 * na}, {0, 1, 2}));
  EXPECT_EQ(fs::file_size(prefix + ".bin"), 2u * expected.size());

  // The default format is still llm.c's, and it holds the same token stream.
  const std::string llmc = (dir / "corpus_llmc.bin").string();
  r = test::run_meshtrain("prepare " + (dir / "a.txt").string() + " " + (dir / "b.txt").string() +
                          " -o " + llmc);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const TokenFile l(llmc, 256);
  EXPECT_EQ(l.format(), TokenFormat::kLlmc);
  EXPECT_EQ(read_all(l), expected);

  // A failed prepare leaves neither file of the pair, nor a temporary one.
  const std::string none = (dir / "none").string();
  r = test::run_meshtrain("prepare " + (dir / "a.txt").string() +
                          " /nonexistent.txt --format megatron -o " + none);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  for (const char* ext : {".bin", ".idx", ".bin.tmp", ".idx.tmp"})
    EXPECT_FALSE(fs::exists(none + ext)) << ext;

  // -o PREFIX.bin names the same pair; an unknown format is refused as bad input.
  r = test::run_meshtrain("prepare " + (dir / "a.txt").string() + " --format megatron -o " +
                          (dir / "other.bin").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(dir / "other.idx"));
  r = test::run_meshtrain("prepare " + (dir / "a.txt").string() + " --format parquet -o " +
                          (dir / "x").string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("parquet"), std::string::npos) << r.output;
}

// A pair written here byte by byte to Megatron-LM's layout, independent of our writer: Llama 3's
// vocabulary (128256) in int32, three documents (the second of two sequences, the third
// empty), read as one stream in document order; and the other integer dtypes.
TEST(MegatronData, ReadsAPairWrittenToMegatronsLayout) {
  const auto dir = test::scratch_dir("megatron-layout");
  const std::vector<int32_t> tokens = {128000, 9906,  11,    1917,  0,
                                       128255, 65535, 65536, 70000, 128001};
  const std::vector<int32_t> lengths = {3, 4, 3};
  const std::vector<int64_t> pointers = {0, 12, 28};  // bytes: 4 per int32 token
  const std::vector<int64_t> documents = {0, 1, 3, 3};
  write_bytes(dir / "llama.idx", megatron_index(4, lengths, pointers, documents));
  write_bytes(dir / "llama.bin", Bytes().put_all(tokens).s);

  const TokenFile f((dir / "llama").string(), 128256);
  EXPECT_EQ(f.format(), TokenFormat::kMegatron);
  EXPECT_EQ(f.num_tokens(), 10);
  EXPECT_EQ(f.num_documents(), 3);
  EXPECT_EQ(f.token_bytes(), 4);
  EXPECT_EQ(read_all(f), tokens);
  std::vector<int32_t> middle(4);
  f.read(5, 4, middle.data());
  EXPECT_EQ(middle, (std::vector<int32_t>{128255, 65535, 65536, 70000}));

  // The sampler cuts sequences across document boundaries, as from an llm.c file.
  const int64_t T = 4;
  const SequenceSampler s(f, T, 0, (10 - 1) / T);
  std::vector<int32_t> in(T), tgt(T);
  s.fill(1, 1, in.data(), tgt.data());
  EXPECT_EQ(in, (std::vector<int32_t>{0, 128255, 65535, 65536}));
  EXPECT_EQ(tgt, (std::vector<int32_t>{128255, 65535, 65536, 70000}));

  // A multimodal index's trailing int8 mode per sequence is accepted (and not needed).
  write_bytes(dir / "mm.idx",
              megatron_index(4, lengths, pointers, documents) + std::string(3, '\0'));
  write_bytes(dir / "mm.bin", Bytes().put_all(tokens).s);
  EXPECT_EQ(read_all(TokenFile((dir / "mm.idx").string(), 128256)), tokens);

  // Every integer dtype: codes 1 uint8, 2 int8, 3 int16, 5 int64, 8 uint16.
  const std::vector<int32_t> small = {1, 2, 3, 100, 5};
  auto check = [&](uint8_t code, int bytes, const std::string& data) {
    const std::string name = fmt::format("d{}", code);
    write_bytes(dir / (name + ".idx"), megatron_index(code, {2, 3}, {0, 2 * bytes}, {0, 2}));
    write_bytes(dir / (name + ".bin"), data);
    const TokenFile g((dir / name).string(), 101);
    EXPECT_EQ(g.token_bytes(), bytes) << name;
    EXPECT_EQ(read_all(g), small) << name;
  };
  auto as = [&]<typename T>(T) {
    Bytes b;
    for (int32_t t : small) b.put(static_cast<T>(t));
    return b.s;
  };
  check(1, 1, as(uint8_t{}));
  check(2, 1, as(int8_t{}));
  check(3, 2, as(int16_t{}));
  check(5, 8, as(int64_t{}));
  check(8, 2, as(uint16_t{}));
}

// Our writer: uint16 up to a vocabulary of 65536, int32 past it (Llama 3).
TEST(MegatronData, WriterPicksUint16OrInt32ByVocab) {
  const auto dir = test::scratch_dir("megatron-writer");
  const std::vector<int32_t> tokens = {5, 65535, 0, 7};
  const std::vector<int64_t> docs = {1, 0, 3};  // an empty document in the middle
  write_megatron_dataset((dir / "narrow").string(), tokens, docs, 65536);
  EXPECT_EQ(file_bytes(dir / "narrow.idx"), megatron_index(8, {1, 3}, {0, 2}, {0, 1, 1, 2}));
  EXPECT_EQ(read_all(TokenFile((dir / "narrow").string(), 65536)), tokens);

  const std::vector<int32_t> wide = {128255, 65536, 3};
  write_megatron_dataset((dir / "wide").string(), wide, std::vector<int64_t>{3}, 128256);
  EXPECT_EQ(file_bytes(dir / "wide.idx"), megatron_index(4, {3}, {0}, {0, 1}));
  EXPECT_EQ(file_bytes(dir / "wide.bin"), Bytes().put_all(wide).s);
  EXPECT_EQ(read_all(TokenFile((dir / "wide").string(), 128256)), wide);

  // A token outside the vocabulary is refused and nothing is written.
  try {
    write_megatron_dataset((dir / "bad").string(), wide, std::vector<int64_t>{3}, 65536);
    FAIL() << "a token past the vocabulary was written";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token 128255 at position 0 is outside the vocabulary"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(dir / "bad.bin"));
  EXPECT_FALSE(fs::exists(dir / "bad.bin.tmp"));
}

// llm.c files: a file written here byte by byte to llm.c's layout reads back exactly, also when
// it is named *.bin (no .idx beside it) and when a Megatron pair lies in the same folder.
TEST(TokenData, LlmcFilesKeepWorking) {
  const auto dir = test::scratch_dir("llmc-keep");
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = 1;
  header[2] = 5;
  const std::vector<uint16_t> tokens = {50256, 15496, 11, 995, 0};
  write_bytes(dir / "shard.bin", Bytes().put_all(header).put_all(tokens).s);
  const TokenFile f((dir / "shard.bin").string(), 50257);
  EXPECT_EQ(f.format(), TokenFormat::kLlmc);
  EXPECT_EQ(f.num_tokens(), 5);
  EXPECT_EQ(read_all(f), (std::vector<int32_t>{50256, 15496, 11, 995, 0}));
  // An llm.c file needs no extension; a Megatron pair beside it does not change what it is.
  write_megatron_dataset((dir / "shard_m").string(), std::vector<int32_t>{1, 2},
                         std::vector<int64_t>{2}, 256);
  fs::copy_file(dir / "shard.bin", dir / "shard_m");
  EXPECT_EQ(TokenFile((dir / "shard_m").string(), 50257).format(), TokenFormat::kLlmc);
}

}  // namespace
}  // namespace mt::train

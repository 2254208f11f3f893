// Token data, memory-mapped (never read whole), in three formats (docs/data.md):
//  - llm.c's token shards: a header of 256 int32 (magic 20240520, version 1, token count, the
//    rest 0) followed by the tokens as uint16.
//  - nanoGPT's prepared data (its prepare.py's train.bin / val.bin): the tokens as uint16 and
//    nothing else. Having no header, it is read only when named (--data-format nanogpt).
//  - Megatron-LM's indexed datasets (PREFIX.idx + PREFIX.bin, megatron/core/datasets/
//    indexed_dataset.py): any integer token type, so vocabularies past 65536 (Llama 3's
//    128256) fit. All sequences, in document order, form one token stream.
// A corpus (train/token_corpus.h) is a list of such files read as one stream.
// Both are files from elsewhere: every size, count and pointer in them is checked against the
// files' real sizes before it is used.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace mt::train {

constexpr int32_t kTokenFileMagic = 20240520;
constexpr int32_t kTokenFileVersion = 1;
constexpr int kTokenFileHeaderInts = 256;

// Megatron-LM's .idx: the 9-byte magic "MMIDIDX\0\0", uint64 version 1, uint8 dtype code,
// uint64 sequence count, uint64 document count (all little-endian; 34 bytes), then int32
// sequence lengths [sequences], int64 sequence byte pointers into the .bin [sequences], int64
// document indices [documents]: the first sequence of each document, starting at 0 and ending
// with the sequence count (so `documents` is the number of documents + 1); a multimodal
// dataset adds int8 sequence modes [sequences], which a token stream does not need.
constexpr char kMegatronIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr uint64_t kMegatronIndexVersion = 1;
constexpr int64_t kMegatronIndexHeaderBytes = 34;

// Megatron-LM's DType codes (the element type of the .bin).
enum class MegatronDtype : uint8_t {
  kUint8 = 1,
  kInt8 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat64 = 6,
  kFloat32 = 7,
  kUint16 = 8,
};

// A whole file mapped read-only (an empty file maps to nothing). `what` names the file's role
// in errors ("data file", "index file").
class MappedFile {
 public:
  MappedFile() = default;
  MappedFile(const std::string& path, const char* what);
  MappedFile(MappedFile&& other) noexcept { swap(other); }
  MappedFile& operator=(MappedFile&& other) noexcept {
    swap(other);
    return *this;
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::string& path() const { return path_; }
  const unsigned char* data() const { return data_; }
  int64_t size_bytes() const { return size_bytes_; }

 private:
  void swap(MappedFile& other) noexcept;
  std::string path_;
  const unsigned char* data_ = nullptr;
  int64_t size_bytes_ = 0;
};

enum class TokenFormat { kLlmc, kMegatron, kNanoGpt };

// What --data-format asks for: auto (llm.c by its header, Megatron-LM by its .idx; a file
// with neither is refused, naming --data-format nanogpt), or one format for every file.
enum class DataFormat { kAuto, kLlmc, kNanoGpt, kMegatron };
DataFormat parse_data_format(const std::string& name);  // auto, llmc, nanogpt, megatron
const char* data_format_name(DataFormat f);
const char* token_format_name(TokenFormat f);  // "llm.c", "nanoGPT", "Megatron-LM"

class TokenFile {
 public:
  // Opens the data at `path`. kAuto: a Megatron-LM pair when `path` names PREFIX.idx,
  // PREFIX.bin with PREFIX.idx beside it, or a PREFIX that is no file but has PREFIX.idx and
  // PREFIX.bin; else an llm.c token file (a file without llm.c's header is refused: it may be
  // nanoGPT's headerless tokens, which only --data-format nanogpt reads). Another `format`
  // reads the path as that format. Validates the header or index against the files' sizes
  // and every token against `vocab` (0 <= token < vocab), refusing bad data with the file, the
  // position and the fix.
  TokenFile(const std::string& path, int64_t vocab, DataFormat format = DataFormat::kAuto);

  const std::string& path() const { return path_; }  // as given
  TokenFormat format() const { return format_; }
  int64_t num_tokens() const { return num_tokens_; }
  // Megatron: the documents in the index (empty ones included); llm.c: 1.
  int64_t num_documents() const { return num_documents_; }
  // Bytes per token in the file: 2 for llm.c and nanoGPT; 1, 2, 4 or 8 for Megatron.
  int token_bytes() const { return token_bytes_; }

  // Tokens [first, first + count) of the stream as int32. Checks each against the vocab again
  // (the file may have changed since it was opened) and refuses one out of range naming the
  // file, the position (and the document), the value and the vocab.
  void read(int64_t first, int64_t count, int32_t* out) const;

 private:
  void open_llmc(const std::string& path);
  void open_nanogpt(const std::string& path);
  void open_megatron(const std::string& prefix);
  void check_all_tokens() const;
  [[noreturn]] void refuse_token(int64_t position, int64_t value) const;
  std::string where(int64_t position) const;  // " (document d of n)" for Megatron

  std::string path_;
  int64_t vocab_ = 0;
  TokenFormat format_ = TokenFormat::kLlmc;
  MappedFile data_;   // the tokens: the llm.c file or the Megatron .bin
  MappedFile index_;  // Megatron's .idx (kept for naming the document of a bad token)
  const unsigned char* tokens_ = nullptr;  // the first token, in data_
  MegatronDtype dtype_ = MegatronDtype::kUint16;
  int token_bytes_ = 2;
  int64_t num_tokens_ = 0;
  int64_t num_documents_ = 1;
  int64_t num_sequences_ = 0;
};

// Writes tokens in llm.c's format, atomically (temporary name, then rename); a failed write
// removes the temporary file.
void write_token_file(const std::string& path, const std::vector<uint16_t>& tokens);

// The PREFIX of a Megatron-LM pair named by PREFIX, PREFIX.bin or PREFIX.idx.
std::string megatron_prefix(const std::string& path);

// Writes a Megatron-LM pair PREFIX.bin + PREFIX.idx: document k is the next
// document_tokens[k] tokens (one sequence, or several of at most 2^31 - 1 tokens when longer);
// the dtype is uint16 for vocab <= 65536, else int32. Atomic: both files are written under
// temporary names (PREFIX.bin.tmp, PREFIX.idx.tmp) and renamed when complete; a failed write
// removes them. Refuses a token outside [0, vocab).
void write_megatron_dataset(const std::string& prefix, std::span<const int32_t> tokens,
                            std::span<const int64_t> document_tokens, int64_t vocab);

}  // namespace mt::train

#include "train/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string_view>
#include <type_traits>
#include <utility>

#include "core/error.h"

namespace mt::train {

// Both formats are little-endian, and the tokens are read in place.
static_assert(std::endian::native == std::endian::little, "token files are little-endian");

namespace {

namespace fs = std::filesystem;

constexpr int64_t kLlmcHeaderBytes = kTokenFileHeaderInts * int64_t{4};
constexpr int64_t kMaxVocab = int64_t{1} << 31;  // token ids are int32

constexpr std::string_view kAccepted =
    "meshtrain reads llm.c token files (a 1024-byte header with magic 20240520, then uint16 "
    "tokens), Megatron-LM indexed datasets (PREFIX.idx + PREFIX.bin, named by PREFIX or "
    "either file) and, with --data-format nanogpt, nanoGPT's headerless uint16 tokens (its "
    "prepare.py's train.bin); `meshtrain prepare --format llmc|megatron` makes the first two";

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A little-endian value at byte `offset` (the .idx arrays are not aligned: they start at 34).
template <typename T>
T load(const unsigned char* bytes, int64_t offset) {
  T v;
  std::memcpy(&v, bytes + offset, sizeof(T));
  return v;
}

// Calls f(T{}) with the integer type of a (checked) dtype.
template <typename F>
decltype(auto) visit_dtype(MegatronDtype dtype, F&& f) {
  switch (dtype) {
    case MegatronDtype::kUint8:
      return f(uint8_t{});
    case MegatronDtype::kInt8:
      return f(int8_t{});
    case MegatronDtype::kInt16:
      return f(int16_t{});
    case MegatronDtype::kInt32:
      return f(int32_t{});
    case MegatronDtype::kInt64:
      return f(int64_t{});
    case MegatronDtype::kUint16:
      return f(uint16_t{});
    case MegatronDtype::kFloat64:
    case MegatronDtype::kFloat32:
      break;
  }
  MT_ASSERT(false && "float dtypes are refused when the index is opened");
  return f(uint16_t{});
}

template <typename T>
bool in_vocab(T v, int64_t vocab) {
  if constexpr (std::is_signed_v<T>)
    if (v < 0) return false;
  return static_cast<uint64_t>(v) < static_cast<uint64_t>(vocab);
}

const char* dtype_name(int code) {
  switch (code) {
    case 1:
      return "uint8";
    case 2:
      return "int8";
    case 3:
      return "int16";
    case 4:
      return "int32";
    case 5:
      return "int64";
    case 6:
      return "float64";
    case 7:
      return "float32";
    case 8:
      return "uint16";
    default:
      return "unknown";
  }
}

// The last i in [0, n) with value(i) <= x, for value rising with i (-1 if none).
template <typename F>
int64_t last_at_or_below(int64_t n, int64_t x, F&& value) {
  int64_t lo = 0, hi = n;  // the first i with value(i) > x is in [lo, hi]
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (value(mid) <= x)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo - 1;
}

// The first bytes of a file, printable: "MMIDIDX\x00\x00".
std::string printable(const unsigned char* bytes, int64_t n) {
  std::string s;
  for (int64_t i = 0; i < n; ++i) {
    const unsigned char c = bytes[i];
    if (c >= 0x20 && c < 0x7f && c != '\\')
      s += static_cast<char>(c);
    else
      s += fmt::format("\\x{:02x}", c);
  }
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// MappedFile

MappedFile::MappedFile(const std::string& path, const char* what) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    fail("cannot open {} '{}': {} (check the path; `meshtrain prepare` makes one)", what, path,
         std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail("cannot read {} '{}': {}", what, path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{} '{}' is not a file (a folder?): name the data file itself", what, path);
  }
  size_bytes_ = static_cast<int64_t>(st.st_size);
  if (size_bytes_ == 0) {  // mmap refuses a length of 0; there is nothing to map
    ::close(fd);
    return;
  }
  void* p = ::mmap(nullptr, static_cast<size_t>(size_bytes_), PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps the file
  if (p == MAP_FAILED)
    fail("cannot map {} '{}' ({} bytes) into memory: {}", what, path, size_bytes_,
         std::strerror(err));
  data_ = static_cast<const unsigned char*>(p);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<unsigned char*>(data_), static_cast<size_t>(size_bytes_));
}

void MappedFile::swap(MappedFile& other) noexcept {
  std::swap(path_, other.path_);
  std::swap(data_, other.data_);
  std::swap(size_bytes_, other.size_bytes_);
}

// ---------------------------------------------------------------------------------------------
// TokenFile

std::string megatron_prefix(const std::string& path) {
  if (ends_with(path, ".idx") || ends_with(path, ".bin")) return path.substr(0, path.size() - 4);
  return path;
}

DataFormat parse_data_format(const std::string& name) {
  if (name == "auto") return DataFormat::kAuto;
  if (name == "llmc") return DataFormat::kLlmc;
  if (name == "nanogpt") return DataFormat::kNanoGpt;
  if (name == "megatron") return DataFormat::kMegatron;
  fail(
      "--data-format '{}' is not a data format (choose auto, llmc, nanogpt or megatron; "
      "docs/data.md)",
      name);
}

const char* data_format_name(DataFormat f) {
  switch (f) {
    case DataFormat::kAuto:
      return "auto";
    case DataFormat::kLlmc:
      return "llmc";
    case DataFormat::kNanoGpt:
      return "nanogpt";
    case DataFormat::kMegatron:
      return "megatron";
  }
  return "auto";
}

const char* token_format_name(TokenFormat f) {
  switch (f) {
    case TokenFormat::kLlmc:
      return "llm.c";
    case TokenFormat::kNanoGpt:
      return "nanoGPT";
    case TokenFormat::kMegatron:
      return "Megatron-LM";
  }
  return "llm.c";
}

TokenFile::TokenFile(const std::string& path, int64_t vocab, DataFormat format)
    : path_(path), vocab_(vocab) {
  if (vocab < 1 || vocab > kMaxVocab)
    fail("vocab {} is outside [1, 2^31]: token ids are int32", vocab);
  std::error_code ec;
  if (fs::is_directory(path, ec))
    fail(
        "data '{}' is a folder, not a token file: name the files in it (a list a.bin,b.bin "
        "or a glob such as '{}/*.bin'; docs/data.md)",
        path, path);
  // The format by the path: a Megatron-LM pair named by PREFIX.idx, PREFIX.bin (with its .idx
  // beside it) or PREFIX (no file of that name); anything else is an llm.c file.
  const std::string prefix = megatron_prefix(path);
  const bool megatron =
      ends_with(path, ".idx") || (ends_with(path, ".bin") && fs::exists(prefix + ".idx", ec)) ||
      (!fs::exists(path, ec) && (fs::exists(path + ".idx", ec) || fs::exists(path + ".bin", ec)));
  switch (format) {
    case DataFormat::kAuto:
      if (megatron)
        open_megatron(prefix);
      else
        open_llmc(path);
      break;
    case DataFormat::kLlmc:
      open_llmc(path);
      break;
    case DataFormat::kMegatron:
      open_megatron(prefix);
      break;
    case DataFormat::kNanoGpt:
      open_nanogpt(path);
      break;
  }
  check_all_tokens();
}

void TokenFile::open_llmc(const std::string& path) {
  format_ = TokenFormat::kLlmc;
  data_ = MappedFile(path, "data file");
  const int64_t file_bytes = data_.size_bytes();
  const std::string no_idx =
      ends_with(path, ".bin")
          ? fmt::format(" (nor half of a Megatron-LM dataset: there is no '{}.idx' beside it)",
                        megatron_prefix(path))
          : std::string();
  if (file_bytes < kLlmcHeaderBytes)
    fail(
        "data file '{}' is shorter than its 1024-byte header ({} bytes): not an llm.c token "
        "file{}. {}",
        path, file_bytes, no_idx, kAccepted);
  const auto magic = load<int32_t>(data_.data(), 0), version = load<int32_t>(data_.data(), 4),
             count = load<int32_t>(data_.data(), 8);
  if (magic != kTokenFileMagic)
    fail(
        "data file '{}' has magic {} instead of {}: not an llm.c token file{}. If it holds "
        "nanoGPT's headerless uint16 tokens, say so with --data-format nanogpt (a file without a "
        "header cannot be told from any other file). {}",
        path, magic, kTokenFileMagic, no_idx, kAccepted);
  if (version != kTokenFileVersion)
    fail("data file '{}' has version {}; only version {} (uint16 tokens) is supported", path,
         version, kTokenFileVersion);
  // The count is an int32: 1024 + 2 * count cannot overflow; checked before any token is read.
  const int64_t expected = kLlmcHeaderBytes + int64_t{2} * count;
  if (count < 0 || file_bytes != expected)
    fail(
        "data file '{}' is damaged: its header says {} tokens ({} bytes) but the file has {} "
        "bytes",
        path, count, expected, file_bytes);
  tokens_ = data_.data() + kLlmcHeaderBytes;
  dtype_ = MegatronDtype::kUint16;
  token_bytes_ = 2;
  num_tokens_ = count;
  num_documents_ = 1;
}

void TokenFile::open_nanogpt(const std::string& path) {
  format_ = TokenFormat::kNanoGpt;
  data_ = MappedFile(path, "data file");
  const int64_t file_bytes = data_.size_bytes();
  if (file_bytes % 2 != 0)
    fail(
        "data file '{}' has {} bytes, an odd number: not nanoGPT's uint16 tokens (2 bytes "
        "each; --data-format nanogpt)",
        path, file_bytes);
  // llm.c's header read as tokens would train on 512 tokens of header: name the format.
  if (file_bytes >= kLlmcHeaderBytes && load<int32_t>(data_.data(), 0) == kTokenFileMagic &&
      load<int32_t>(data_.data(), 4) == kTokenFileVersion)
    fail(
        "data file '{}' starts with llm.c's header (magic {}): it is an llm.c token file, not "
        "nanoGPT's headerless tokens (use --data-format llmc or auto)",
        path, kTokenFileMagic);
  tokens_ = data_.data();
  dtype_ = MegatronDtype::kUint16;
  token_bytes_ = 2;
  num_tokens_ = file_bytes / 2;
  num_documents_ = 1;
}

void TokenFile::open_megatron(const std::string& prefix) {
  format_ = TokenFormat::kMegatron;
  const std::string idx_path = prefix + ".idx", bin_path = prefix + ".bin";
  index_ = MappedFile(idx_path, "Megatron-LM index file");
  data_ = MappedFile(bin_path, "Megatron-LM data file");
  const unsigned char* idx = index_.data();
  const int64_t idx_bytes = index_.size_bytes(), bin_bytes = data_.size_bytes();

  // The header, each field only once the file is known to hold it.
  const int64_t magic_bytes = std::min<int64_t>(idx_bytes, sizeof(kMegatronIndexMagic));
  if (magic_bytes > 0 && std::memcmp(idx, kMegatronIndexMagic, magic_bytes) != 0)
    fail(
        "Megatron-LM index file '{}' starts with \"{}\" instead of the magic "
        "\"MMIDIDX\\x00\\x00\": not a Megatron-LM index. {}",
        idx_path, printable(idx, magic_bytes), kAccepted);
  if (idx_bytes < kMegatronIndexHeaderBytes)
    fail("Megatron-LM index file '{}' is truncated: {} bytes, less than its {}-byte header",
         idx_path, idx_bytes, kMegatronIndexHeaderBytes);
  const auto version = load<uint64_t>(idx, 9);
  if (version != kMegatronIndexVersion)
    fail("Megatron-LM index file '{}' has version {}; only version {} is supported", idx_path,
         version, kMegatronIndexVersion);
  const int code = idx[17];
  if (code == 6 || code == 7)
    fail(
        "Megatron-LM dataset '{}' holds {} values (dtype code {}), not token ids: only integer "
        "dtypes are read (uint8, int8, int16, int32, int64, uint16)",
        idx_path, dtype_name(code), code);
  if (code < 1 || code > 8)
    fail(
        "Megatron-LM index file '{}' has the unknown dtype code {} (Megatron-LM's codes: 1 "
        "uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16)",
        idx_path, code);
  dtype_ = static_cast<MegatronDtype>(code);
  token_bytes_ = visit_dtype(dtype_, [](auto t) { return static_cast<int>(sizeof(t)); });
  const auto sequences = load<uint64_t>(idx, 18), documents = load<uint64_t>(idx, 26);

  // The arrays' size from the counts, without overflow, against the file's size.
  uint64_t need = 0, documents_bytes = 0;
  const bool fits = !__builtin_mul_overflow(sequences, uint64_t{12}, &need) &&
                    !__builtin_add_overflow(need, uint64_t{kMegatronIndexHeaderBytes}, &need) &&
                    !__builtin_mul_overflow(documents, uint64_t{8}, &documents_bytes) &&
                    !__builtin_add_overflow(need, documents_bytes, &need);
  if (!fits || need > static_cast<uint64_t>(idx_bytes))
    fail(
        "Megatron-LM index file '{}' is truncated: its header says {} sequences and {} "
        "document indices, {} bytes in all, but the file has {} bytes",
        idx_path, sequences, documents,
        fits ? fmt::format("{}", need) : std::string("more than 2^64"), idx_bytes);
  // Exactly the arrays, or the arrays and a multimodal dataset's int8 mode per sequence.
  const uint64_t extra = static_cast<uint64_t>(idx_bytes) - need;
  if (extra != 0 && extra != sequences)
    fail(
        "Megatron-LM index file '{}' has {} bytes after its arrays ({} sequences, {} document "
        "indices), where Megatron-LM writes 0 (or {}, one mode per sequence, when multimodal): "
        "a damaged index",
        idx_path, extra, sequences, documents, sequences);
  // Both counts are now below the file's size, so they fit int64 and every offset below does.
  const auto S = static_cast<int64_t>(sequences), D = static_cast<int64_t>(documents);
  const int64_t lengths_at = kMegatronIndexHeaderBytes, pointers_at = lengths_at + 4 * S,
                documents_at = pointers_at + 8 * S;

  // The lengths add up to the .bin's size.
  int64_t total_tokens = 0;
  for (int64_t i = 0; i < S; ++i) {
    const auto length = load<int32_t>(idx, lengths_at + 4 * i);
    if (length < 0)
      fail("Megatron-LM index file '{}' gives sequence {} the negative length {}", idx_path, i,
           length);
    if (__builtin_add_overflow(total_tokens, int64_t{length}, &total_tokens))
      fail("Megatron-LM index file '{}': its sequence lengths add up to more than 2^63 tokens",
           idx_path);
  }
  int64_t total_bytes = 0;
  const bool overflow = __builtin_mul_overflow(total_tokens, int64_t{token_bytes_}, &total_bytes);
  if (overflow || total_bytes > bin_bytes)
    fail(
        "Megatron-LM data file '{}' is truncated: its index '{}' lists {} sequences of {} "
        "tokens in all ({} bytes of {}) but the file has {} bytes",
        bin_path, idx_path, S, total_tokens,
        overflow ? std::string("more than 2^63") : fmt::format("{}", total_bytes), dtype_name(code),
        bin_bytes);
  if (total_bytes < bin_bytes)
    fail(
        "Megatron-LM data file '{}' has {} bytes, but the lengths in its index '{}' add up to "
        "{} tokens ({} bytes of {}): the index and the data do not match (a damaged index, or "
        "the .bin of another dataset)",
        bin_path, bin_bytes, idx_path, total_tokens, total_bytes, dtype_name(code));

  // The pointers: each inside the .bin, and the sequences back to back in order (as Megatron-LM
  // writes them), so that the .bin is the token stream in document order.
  int64_t end = 0;
  for (int64_t i = 0; i < S; ++i) {
    const auto pointer = load<int64_t>(idx, pointers_at + 8 * i);
    const int64_t bytes = int64_t{load<int32_t>(idx, lengths_at + 4 * i)} * token_bytes_;
    if (pointer < 0 || pointer > bin_bytes || bytes > bin_bytes - pointer)
      fail(
          "Megatron-LM index file '{}': sequence {} points to byte {} ({} bytes long), outside "
          "the data file '{}' of {} bytes",
          idx_path, i, pointer, bytes, bin_path, bin_bytes);
    if (pointer != end)
      fail(
          "Megatron-LM index file '{}': sequence {} starts at byte {}, but the sequences before "
          "it end at byte {}: pointers out of order, overlapping or leaving a gap (Megatron-LM "
          "writes the sequences back to back, in order)",
          idx_path, i, pointer, end);
    end += bytes;
  }

  // The document indices: 0, then non-decreasing, ending with the sequence count.
  if (D < 1)
    fail(
        "Megatron-LM index file '{}' has no document indices (Megatron-LM writes at least the "
        "leading 0): a damaged index",
        idx_path);
  int64_t previous = 0;
  for (int64_t k = 0; k < D; ++k) {
    const auto first = load<int64_t>(idx, documents_at + 8 * k);
    if ((k == 0 && first != 0) || first < previous || first > S)
      fail(
          "Megatron-LM index file '{}': document index {} is {}{}: the document indices must "
          "rise from 0 to the sequence count {}",
          idx_path, k, first, k > 0 ? fmt::format(" after {}", previous) : std::string(), S);
    previous = first;
  }
  if (previous != S)
    fail(
        "Megatron-LM index file '{}': the last document index is {}, not the sequence count {}: "
        "the documents do not cover every sequence",
        idx_path, previous, S);

  tokens_ = data_.data();
  num_tokens_ = total_tokens;
  num_sequences_ = S;
  num_documents_ = D - 1;
}

std::string TokenFile::where(int64_t position) const {
  if (format_ != TokenFormat::kMegatron) return {};
  const unsigned char* idx = index_.data();
  const int64_t pointers_at = kMegatronIndexHeaderBytes + 4 * num_sequences_,
                documents_at = pointers_at + 8 * num_sequences_;
  // The sequence holding the token: the last one starting at or before its byte (the pointers
  // rise, checked when the index was opened); then the last document starting at or before it.
  // (A binary search by hand: clang 14, the fuzz build's compiler, cannot compile
  // std::ranges::upper_bound over an iota_view with libstdc++ 12.)
  const int64_t byte = position * token_bytes_;
  const int64_t sequence = last_at_or_below(
      num_sequences_, byte, [&](int64_t i) { return load<int64_t>(idx, pointers_at + 8 * i); });
  const int64_t document = last_at_or_below(num_documents_ + 1, sequence, [&](int64_t k) {
    return load<int64_t>(idx, documents_at + 8 * k);
  });
  return fmt::format(" (document {} of {}, sequence {})", document, num_documents_, sequence);
}

namespace {
template <typename T>
void min_max(const unsigned char* tokens, int64_t count, int64_t& lo, int64_t& hi) {
  const T* p = reinterpret_cast<const T*>(tokens);
  T a = std::numeric_limits<T>::max(), b = std::numeric_limits<T>::lowest();
  for (int64_t i = 0; i < count; ++i) {
    a = std::min(a, p[i]);
    b = std::max(b, p[i]);
  }
  lo = static_cast<int64_t>(a);
  hi = static_cast<int64_t>(b);
}
}  // namespace

void TokenFile::refuse_token(int64_t position, int64_t value) const {
  const std::string& file = data_.path();
  if (value < 0)
    fail("data file '{}': token {} at position {}{} is negative: not a token id (a damaged file?)",
         file, value, position, where(position));
  // Names the file's largest token, not just the first one out of range: the suggested --vocab
  // then works at the first retry (the scan runs only on this error path).
  int64_t lo = 0, hi = 0;
  visit_dtype(dtype_, [&](auto t) { min_max<decltype(t)>(tokens_, num_tokens_, lo, hi); });
  fail(
      "data file '{}': token {} at position {}{} is >= the model's vocab {}; the largest token "
      "in the file is {}: use --vocab {} or more, or data made for this vocabulary",
      file, value, position, where(position), vocab_, hi, hi + 1);
}

void TokenFile::check_all_tokens() const {
  visit_dtype(dtype_, [&](auto t) {
    using T = decltype(t);
    int64_t lo = 0, hi = 0;
    min_max<T>(tokens_, num_tokens_, lo, hi);
    if (num_tokens_ == 0 || (lo >= 0 && hi < vocab_)) return;
    const T* p = reinterpret_cast<const T*>(tokens_);
    for (int64_t i = 0; i < num_tokens_; ++i)
      if (!in_vocab(p[i], vocab_)) refuse_token(i, static_cast<int64_t>(p[i]));
  });
}

void TokenFile::read(int64_t first, int64_t count, int32_t* out) const {
  MT_ASSERT(first >= 0 && count >= 0 && first <= num_tokens_ - count);
  visit_dtype(dtype_, [&](auto t) {
    using T = decltype(t);
    const T* p = reinterpret_cast<const T*>(tokens_) + first;
    for (int64_t i = 0; i < count; ++i) {
      const T v = p[i];
      if (!in_vocab(v, vocab_)) refuse_token(first + i, static_cast<int64_t>(v));
      out[i] = static_cast<int32_t>(v);
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Writers

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

namespace {
template <typename T>
void put(std::ofstream& out, T v) {
  out.write(reinterpret_cast<const char*>(&v), sizeof(T));
}

template <typename T>
void put_array(std::ofstream& out, const std::vector<T>& v) {
  out.write(reinterpret_cast<const char*>(v.data()),
            static_cast<std::streamsize>(sizeof(T) * v.size()));
}

// The tokens as T, a block at a time.
template <typename T>
void put_tokens(std::ofstream& out, std::span<const int32_t> tokens) {
  std::vector<T> block(std::min<size_t>(tokens.size(), size_t{1} << 16));
  for (size_t at = 0; at < tokens.size(); at += block.size()) {
    const size_t n = std::min(block.size(), tokens.size() - at);
    for (size_t i = 0; i < n; ++i) block[i] = static_cast<T>(tokens[at + i]);
    out.write(reinterpret_cast<const char*>(block.data()),
              static_cast<std::streamsize>(sizeof(T) * n));
  }
}
}  // namespace

void write_megatron_dataset(const std::string& prefix, std::span<const int32_t> tokens,
                            std::span<const int64_t> document_tokens, int64_t vocab) {
  if (vocab < 1 || vocab > kMaxVocab)
    fail("vocab {} is outside [1, 2^31]: token ids are int32", vocab);
  int64_t listed = 0;
  for (const int64_t n : document_tokens) {
    MT_ASSERT(n >= 0);
    listed += n;
  }
  MT_ASSERT(listed == static_cast<int64_t>(tokens.size()));
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= vocab)
      fail("token {} at position {} is outside the vocabulary [0, {}): nothing written", tokens[i],
           i, vocab);
  // uint16 holds every id of a vocabulary of up to 65536; Megatron-LM's int32 the rest.
  const bool narrow = vocab <= 65536;
  const auto dtype = narrow ? MegatronDtype::kUint16 : MegatronDtype::kInt32;
  const int64_t token_bytes = narrow ? 2 : 4;

  // One sequence per document (a document longer than an int32 length: several).
  std::vector<int32_t> lengths;
  std::vector<int64_t> pointers, document_index{0};
  int64_t byte = 0;
  for (const int64_t n : document_tokens) {
    for (int64_t left = n; left > 0;) {
      const int64_t length = std::min<int64_t>(left, std::numeric_limits<int32_t>::max());
      lengths.push_back(static_cast<int32_t>(length));
      pointers.push_back(byte);
      byte += length * token_bytes;
      left -= length;
    }
    document_index.push_back(static_cast<int64_t>(lengths.size()));
  }

  const std::string bin = prefix + ".bin", idx = prefix + ".idx";
  const std::string bin_tmp = bin + ".tmp", idx_tmp = idx + ".tmp";
  try {
    {
      std::ofstream out(bin_tmp, std::ios::binary | std::ios::trunc);
      if (!out)
        fail("cannot write '{}' (via '{}'): does the directory exist and is it writable?", bin,
             bin_tmp);
      if (narrow)
        put_tokens<uint16_t>(out, tokens);
      else
        put_tokens<int32_t>(out, tokens);
      if (!out) fail_run("writing '{}' failed (disk full?)", bin_tmp);
    }
    {
      std::ofstream out(idx_tmp, std::ios::binary | std::ios::trunc);
      if (!out)
        fail("cannot write '{}' (via '{}'): does the directory exist and is it writable?", idx,
             idx_tmp);
      out.write(kMegatronIndexMagic, sizeof(kMegatronIndexMagic));
      put<uint64_t>(out, kMegatronIndexVersion);
      put<uint8_t>(out, static_cast<uint8_t>(dtype));
      put<uint64_t>(out, lengths.size());
      put<uint64_t>(out, document_index.size());
      put_array(out, lengths);
      put_array(out, pointers);
      put_array(out, document_index);
      if (!out) fail_run("writing '{}' failed (disk full?)", idx_tmp);
    }
    // The .bin first: a crash between the two renames leaves a new .bin beside an old .idx,
    // which the reader refuses (the lengths do not add up), never a silent mix.
    std::filesystem::rename(bin_tmp, bin);
    std::filesystem::rename(idx_tmp, idx);
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(bin_tmp, ignored);  // no half-written file left behind
    std::filesystem::remove(idx_tmp, ignored);
    throw;
  }
}

}  // namespace mt::train

#include "obs/tensorboard.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "obs/run_info.h"

namespace mt::obs {

namespace {

std::array<uint32_t, 256> crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

// Protobuf wire format: key = field << 3 | wire type (0 varint, 1 fixed64, 2 bytes,
// 5 fixed32).
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void key(std::string& out, int field, int wire) {
  varint(out, static_cast<uint64_t>(field << 3 | wire));
}
template <typename T>
void fixed(std::string& out, T v) {  // little-endian, as x86 and the format are
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}
void bytes_field(std::string& out, int field, const std::string& b) {
  key(out, field, 2);
  varint(out, b.size());
  out += b;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// tensorflow.Event: wall_time = 1 (double), step = 2 (int64), file_version = 3 (string),
// summary = 5 (Summary { repeated Value value = 1 }, Value { tag = 1, simple_value = 2 }).
std::string event_header(double wall_time) {
  std::string e;
  key(e, 1, 1);
  fixed(e, wall_time);
  return e;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  static const std::array<uint32_t, 256> table = crc_table();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  if (dir.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir))
    fail("--tensorboard '{}' is not a folder that can be made ({})", dir, ec.message());
  path_ = (std::filesystem::path(dir) /
           ("events.out.tfevents." + std::to_string(static_cast<int64_t>(now_s())) + "." +
            host_name() + "." + std::to_string(::getpid())))
              .string();
  file_ = std::fopen(path_.c_str(), "wb");
  if (!file_) fail("cannot write the TensorBoard event file '{}' (check the folder)", path_);
  std::string e = event_header(now_s());
  bytes_field(e, 3, "brain.Event:2");
  record(e);
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::record(const std::string& data) {
  std::string r;
  const uint64_t n = data.size();
  fixed(r, n);
  fixed(r, masked_crc32c(r.data(), 8));
  r += data;
  fixed(r, masked_crc32c(data.data(), data.size()));
  if (std::fwrite(r.data(), 1, r.size(), file_) != r.size())
    fail("cannot write the TensorBoard event file '{}'", path_);
}

void TensorBoardWriter::scalar(const std::string& tag, double value, int64_t step) {
  if (!file_) return;
  std::string v;
  bytes_field(v, 1, tag);
  key(v, 2, 5);
  fixed(v, static_cast<float>(value));
  std::string summary;
  bytes_field(summary, 1, v);
  std::string e = event_header(now_s());
  key(e, 2, 0);
  varint(e, static_cast<uint64_t>(step));
  bytes_field(e, 5, summary);
  record(e);
}

void TensorBoardWriter::flush() {
  if (file_) std::fflush(file_);
}

}  // namespace mt::obs

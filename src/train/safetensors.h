// The safetensors format (Hugging Face): 8-byte little-endian header length N, N bytes of
// JSON {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}},
// then the raw little-endian data.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace mt::train {

struct NamedArray {
  std::string name;
  Shape shape;
  std::vector<float> data;  // f32, row-major
};

// Writes atomically (temporary name, fsync, rename: io::write_file): a crash never leaves half
// a file, a failed write (a full disk) is an error at once and leaves no temporary file; an
// existing device or pipe (/dev/null) is written in place.
void write_safetensors(const std::string& path, const std::vector<NamedArray>& arrays,
                       const std::map<std::string, std::string>& metadata);

struct SafetensorsFile {
  std::map<std::string, NamedArray> arrays;  // F32, BF16 and F16 read as f32
  std::map<std::string, std::string> metadata;
};
// Hugging Face's own reader refuses a header over 100 MB (safetensors' MAX_HEADER_SIZE).
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// Refuses a missing, truncated or malformed file with a message naming it: a header length
// past the file's end, an entry that is not {dtype, shape, data_offsets} with integers, data
// offsets outside the file or not the shape's size, tensors that overlap. What it allocates
// is bounded by the file's size.
SafetensorsFile read_safetensors(const std::string& path);

}  // namespace mt::train

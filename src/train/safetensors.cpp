#include "train/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json.h"
#include "core/write_file.h"
#include "train/json_read.h"

namespace mt::train {

using json = nlohmann::json;

void write_safetensors(const std::string& path, const std::vector<NamedArray>& arrays,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  int64_t offset = 0;
  for (const auto& a : arrays) {
    MT_ASSERT(static_cast<int64_t>(a.data.size()) == shape_numel(a.shape));
    const int64_t bytes = static_cast<int64_t>(a.data.size()) * 4;
    header[a.name] = {
        {"dtype", "F32"}, {"shape", a.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  while ((text.size() + 8) % 8 != 0) text += ' ';  // align the data to 8 bytes
  const uint64_t n = text.size();
  std::vector<io::Chunk> chunks = {{&n, 8}, {text.data(), text.size()}};
  for (const auto& a : arrays) chunks.push_back({a.data.data(), a.data.size() * 4});
  io::write_file(path, chunks);
}

namespace {
float half_to_f32(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  float v;
  if (exp == 0)
    v = std::ldexp(static_cast<float>(mant), -24);
  else if (exp == 31)
    v = mant ? NAN : INFINITY;
  else
    v = std::ldexp(static_cast<float>(mant | 0x400), static_cast<int>(exp) - 25);
  return sign ? -v : v;
}
}  // namespace

SafetensorsFile read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open weights file '{}' (check the path)", path);
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) fail("cannot read weights file '{}': {}", path, ec.message());
  const auto file_bytes = static_cast<int64_t>(size);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  // The header length is checked against the file before anything is allocated for it.
  if (in.gcount() != 8 || n > static_cast<uint64_t>(file_bytes - 8))
    fail(
        "weights file '{}' is not a safetensors file (bad header length: {} bytes claimed, the "
        "file has {})",
        path, n, file_bytes);
  if (n > kSafetensorsMaxHeaderBytes)
    fail("weights file '{}' has a safetensors header of {} bytes: more than the format's {}", path,
         n, kSafetensorsMaxHeaderBytes);
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  json header;
  try {
    header = parse_json(text);
  } catch (const std::exception& e) {
    fail("weights file '{}' has a malformed safetensors header: {}", path, e.what());
  }
  if (!header.is_object())
    fail("weights file '{}' has a malformed safetensors header: not a JSON object", path);
  const int64_t data_start = 8 + static_cast<int64_t>(n);
  const int64_t data_bytes = file_bytes - data_start;

  // Every entry checked first: its bytes lie in the file and overlap no other entry's, so
  // what is decoded below (at most 2 floats per byte) is bounded by the file's size.
  struct Entry {
    std::string name, dtype;
    Shape shape;
    int64_t begin = 0, end = 0;
  };
  std::vector<Entry> entries;
  SafetensorsFile f;
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object())
        fail("weights file '{}': __metadata__ must be a JSON object, not {}", path,
             entry.type_name());
      for (auto& [k, v] : entry.items())
        f.metadata[k] = v.is_string() ? v.get<std::string>() : v.dump();
      continue;
    }
    const std::string where = fmt::format("weights file '{}': tensor '{}'", path, name);
    Entry e;
    e.name = name;
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets") || !entry["dtype"].is_string() ||
        !entry["shape"].is_array() || !entry["data_offsets"].is_array() ||
        entry["data_offsets"].size() != 2)
      fail(
          "{} is malformed: each tensor needs \"dtype\" (a string), \"shape\" (an array) and "
          "\"data_offsets\" ([begin, end])",
          where);
    e.dtype = entry["dtype"].get<std::string>();
    const int64_t elem = e.dtype == "F32" ? 4 : (e.dtype == "BF16" || e.dtype == "F16") ? 2 : 0;
    if (elem == 0) fail("{} has dtype {}; F32, BF16 or F16 expected", where, e.dtype);
    // The product of the non-zero dimensions fits int64 (so shape_numel never overflows,
    // whatever the order); a zero dimension makes an empty tensor.
    int64_t nonzero = 1;
    bool empty = false;
    for (const json& d : entry["shape"]) {
      const int64_t x = json_integer(d, where, "a dimension of its shape", 0);
      e.shape.push_back(x);
      if (x == 0) {
        empty = true;
      } else if (nonzero > std::numeric_limits<int64_t>::max() / x) {
        fail("{} is damaged: its shape {} has more elements than an int64 counts", where,
             shape_str(e.shape));
      } else {
        nonzero *= x;
      }
    }
    const int64_t count = empty ? 0 : nonzero;
    if (count > data_bytes / elem)
      fail(
          "weights file '{}' is truncated or damaged: tensor '{}' ({} {}) needs {} x {} bytes, "
          "more than the file's {} data bytes",
          path, name, e.dtype, shape_str(e.shape), count, elem, data_bytes);
    e.begin = json_integer(entry["data_offsets"][0], where, "data_offsets[0]", 0);
    e.end = json_integer(entry["data_offsets"][1], where, "data_offsets[1]", 0);
    if (e.end > data_bytes || e.begin > e.end)
      fail(
          "weights file '{}' is truncated or damaged: tensor '{}' needs bytes [{}, {}) of its {} "
          "data bytes",
          path, name, e.begin, e.end, data_bytes);
    if (e.end - e.begin != count * elem)
      fail(
          "weights file '{}' is truncated or damaged: tensor '{}' ({} {}) needs {} bytes but its "
          "data_offsets [{}, {}) hold {}",
          path, name, e.dtype, shape_str(e.shape), count * elem, e.begin, e.end, e.end - e.begin);
    entries.push_back(std::move(e));
  }
  std::vector<const Entry*> by_offset;
  for (const Entry& e : entries)
    if (e.end > e.begin) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const Entry* a, const Entry* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i]->begin < by_offset[i - 1]->end)
      fail(
          "weights file '{}' is damaged: tensors '{}' and '{}' overlap (bytes [{}, {}) and [{}, "
          "{}))",
          path, by_offset[i - 1]->name, by_offset[i]->name, by_offset[i - 1]->begin,
          by_offset[i - 1]->end, by_offset[i]->begin, by_offset[i]->end);

  std::vector<char> data(static_cast<size_t>(data_bytes));
  in.read(data.data(), static_cast<std::streamsize>(data.size()));
  if (in.gcount() != static_cast<std::streamsize>(data.size()))
    fail("weights file '{}' could not be read whole (did it change while being read?)", path);
  for (Entry& e : entries) {
    NamedArray a;
    a.name = e.name;
    a.shape = std::move(e.shape);
    const int64_t elem = e.dtype == "F32" ? 4 : 2;
    const int64_t count = (e.end - e.begin) / elem;
    a.data.resize(static_cast<size_t>(count));
    const char* src = data.data() + e.begin;
    for (int64_t i = 0; i < count; ++i) {
      if (elem == 4) {
        std::memcpy(&a.data[i], src + 4 * i, 4);
      } else {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        a.data[i] = e.dtype == "BF16" ? bf16_to_f32(bf16{h}) : half_to_f32(h);
      }
    }
    f.arrays.emplace(e.name, std::move(a));
  }
  return f;
}

}  // namespace mt::train

#include "train/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

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
    header[a.name] = {{"dtype", "F32"}, {"shape", a.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  while ((text.size() + 8) % 8 != 0) text += ' ';  // align the data to 8 bytes
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail("cannot write '{}' (does the directory exist and is it writable?)", tmp);
    const uint64_t n = text.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(text.data(), static_cast<std::streamsize>(n));
    for (const auto& a : arrays)
      out.write(reinterpret_cast<const char*>(a.data.data()),
                static_cast<std::streamsize>(a.data.size() * 4));
    out.flush();
    if (!out) fail_run("writing '{}' failed (disk full?)", tmp);
  }
  int fd = ::open(tmp.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
  std::filesystem::rename(tmp, path);
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
  const auto file_bytes = static_cast<int64_t>(std::filesystem::file_size(path));
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  if (in.gcount() != 8 || static_cast<int64_t>(n) > file_bytes - 8)
    fail("weights file '{}' is not a safetensors file (bad header length)", path);
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  json header;
  try {
    header = json::parse(text);
  } catch (const std::exception& e) {
    fail("weights file '{}' has a malformed safetensors header: {}", path, e.what());
  }
  const int64_t data_start = 8 + static_cast<int64_t>(n);
  std::vector<char> data(static_cast<size_t>(file_bytes - data_start));
  in.read(data.data(), static_cast<std::streamsize>(data.size()));
  SafetensorsFile f;
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      for (auto& [k, v] : entry.items()) f.metadata[k] = v.is_string() ? v.get<std::string>() : v.dump();
      continue;
    }
    NamedArray a;
    a.name = name;
    std::string dtype;
    int64_t begin = 0, end = 0;
    try {
      dtype = entry.at("dtype").get<std::string>();
      a.shape = entry.at("shape").get<Shape>();
      begin = entry.at("data_offsets").at(0).get<int64_t>();
      end = entry.at("data_offsets").at(1).get<int64_t>();
    } catch (const std::exception& e) {
      fail("weights file '{}': entry '{}' is malformed: {}", path, name, e.what());
    }
    const int64_t count = shape_numel(a.shape);
    const int64_t elem = dtype == "F32" ? 4 : (dtype == "BF16" || dtype == "F16") ? 2 : 0;
    if (elem == 0) fail("weights file '{}': tensor '{}' has dtype {}; F32, BF16 or F16 expected", path, name, dtype);
    if (begin < 0 || end != begin + count * elem || end > static_cast<int64_t>(data.size()))
      fail("weights file '{}' is truncated or damaged: tensor '{}' needs bytes [{}, {}) of {}",
           path, name, begin, begin + count * elem, data.size());
    a.data.resize(static_cast<size_t>(count));
    const char* src = data.data() + begin;
    for (int64_t i = 0; i < count; ++i) {
      if (elem == 4) {
        std::memcpy(&a.data[i], src + 4 * i, 4);
      } else {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        a.data[i] = dtype == "BF16" ? bf16_to_f32(bf16{h}) : half_to_f32(h);
      }
    }
    f.arrays.emplace(name, std::move(a));
  }
  return f;
}

}  // namespace mt::train

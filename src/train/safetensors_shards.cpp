#include "train/safetensors_shards.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/json.h"

namespace mt::train {
namespace fs = std::filesystem;

namespace {

// The hub's largest indexes (Llama 3.1 405B: 191 shards, ~1,300 tensors) are about 100 KB.
constexpr uintmax_t kMaxIndexBytes = uintmax_t{64} << 20;

// A shard is named by a plain file name in the index's folder; anything that could reach
// outside it (a separator, "..", an absolute path) is refused.
void check_shard_name(const std::string& name, const std::string& index_path,
                      const std::string& tensor) {
  const std::string ext = ".safetensors";
  const bool plain = !name.empty() && name.find('/') == std::string::npos &&
                     name.find('\\') == std::string::npos && name.find('\0') == std::string::npos &&
                     name != "." && name != ".." && name.size() > ext.size() &&
                     name.compare(name.size() - ext.size(), ext.size(), ext) == 0;
  if (!plain)
    fail(
        "weights index '{}': tensor '{}' is mapped to '{}', which is not a file name ending in "
        ".safetensors in the index's folder",
        index_path, tensor, name);
}

}  // namespace

SafetensorsFile read_safetensors_shards(const std::string& index_path) {
  std::error_code ec;
  const uintmax_t bytes = fs::file_size(index_path, ec);
  if (ec) fail("cannot read weights index '{}': {}", index_path, ec.message());
  if (bytes > kMaxIndexBytes)
    fail("weights index '{}' is {} bytes: more than the {} an index of tensor names needs",
         index_path, bytes, kMaxIndexBytes);
  std::ifstream in(index_path, std::ios::binary);
  if (!in) fail("cannot open weights index '{}'", index_path);
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = parse_json(text.str());  // nesting bounded (core/json.h)
  } catch (const std::exception& e) {
    fail("weights index '{}' is not valid JSON: {}", index_path, e.what());
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object() ||
      j["weight_map"].empty())
    fail(
        "weights index '{}' must be a JSON object with a non-empty \"weight_map\": {{tensor "
        "name: shard file name}}",
        index_path);

  // tensor -> shard, and each shard's tensors, from the index.
  std::map<std::string, std::string> shard_of;
  std::map<std::string, int> tensors_in;
  for (auto& [tensor, v] : j["weight_map"].items()) {
    if (!v.is_string())
      fail("weights index '{}': tensor '{}' must map to a shard file name (a string), not {}",
           index_path, tensor, v.type_name());
    const std::string shard = v.get<std::string>();
    check_shard_name(shard, index_path, tensor);
    shard_of[tensor] = shard;
    ++tensors_in[shard];
  }

  const fs::path folder = fs::path(index_path).parent_path();
  SafetensorsFile all;
  for (const auto& [shard, expected] : tensors_in) {
    SafetensorsFile f;
    try {
      f = read_safetensors((folder / shard).string());
    } catch (const Error& e) {
      if (e.code() != ExitCode::kBadInput) throw;
      fail("weights index '{}': shard '{}': {}", index_path, shard, e.what());
    }
    int found = 0;
    for (auto& [name, array] : f.arrays) {
      auto it = shard_of.find(name);
      if (it == shard_of.end() || it->second != shard)
        fail("weights index '{}': shard '{}' holds tensor '{}', which the index maps to {}",
             index_path, shard, name,
             it == shard_of.end() ? std::string("no shard") : "'" + it->second + "'");
      all.arrays.emplace(name, std::move(array));  // unique: the index maps a name once
      ++found;
    }
    if (found != expected) {
      for (const auto& [tensor, s] : shard_of)
        if (s == shard && !all.arrays.count(tensor))
          fail("weights index '{}' maps tensor '{}' to shard '{}', which does not hold it",
               index_path, tensor, shard);
    }
    for (auto& [k, v] : f.metadata) all.metadata.emplace(k, v);
  }
  return all;
}

}  // namespace mt::train

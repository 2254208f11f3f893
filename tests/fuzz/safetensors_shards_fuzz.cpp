// The reader of a hub checkpoint split over shards (train/safetensors_shards.h): the
// index's JSON (weight_map: tensor -> shard file name, checked to stay in its folder) and
// the two shard files it may name, each a safetensors file.
//
// Input: two little-endian uint16 lengths (the index's bytes, then the first shard's, each
// cut to what the input has), the index, the first shard, and the rest as the second shard.
// The files are model.safetensors.index.json, model-00001-of-00002.safetensors and
// model-00002-of-00002.safetensors in a folder of their own.
#include <algorithm>
#include <filesystem>

#include "fuzz.h"
#include "train/safetensors_shards.h"

using namespace mt;

MT_FUZZ_TARGET(safetensors_shards) {
  auto u16 = [&](size_t at) -> size_t {
    return at + 1 < bytes.size()
               ? static_cast<unsigned char>(bytes[at]) |
                     static_cast<size_t>(static_cast<unsigned char>(bytes[at + 1])) << 8
               : 0;
  };
  const size_t head = std::min<size_t>(4, bytes.size());
  std::string_view rest = bytes.substr(head);
  const size_t n_index = std::min(u16(0), rest.size());
  const std::string_view index = rest.substr(0, n_index);
  rest = rest.substr(n_index);
  const size_t n_first = std::min(u16(2), rest.size());
  const std::string_view first = rest.substr(0, n_first), second = rest.substr(n_first);

  const std::filesystem::path dir = fuzz::scratch_dir() / "shards";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / train::kSafetensorsIndexName).string();
  fuzz::write_file(path, index);
  fuzz::write_file((dir / "model-00001-of-00002.safetensors").string(), first);
  fuzz::write_file((dir / "model-00002-of-00002.safetensors").string(), second);
  fuzz::read_or_refuse(path, [&] {
    const train::SafetensorsFile f = train::read_safetensors_shards(path);
    size_t elems = 0;
    for (const auto& [name, a] : f.arrays) elems += a.data.size();
    if (elems > first.size() + second.size())
      throw fuzz::Bug("read more elements than the shards have bytes");
  });
}

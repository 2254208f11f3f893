// The safetensors reader (train/safetensors.h): the 8-byte header length, the header's JSON
// (dtype, shape, data_offsets of every tensor; __metadata__) and the data it points into.
#include "fuzz.h"
#include "train/safetensors.h"

using namespace mt;

MT_FUZZ_TARGET(safetensors) {
  const std::string path = fuzz::write_input("weights.safetensors", bytes);
  fuzz::read_or_refuse(path, [&] {
    const train::SafetensorsFile f = train::read_safetensors(path);
    // What was read is what the file holds: every array within the file's bytes.
    size_t elems = 0;
    for (const auto& [name, a] : f.arrays) elems += a.data.size();
    if (elems > bytes.size()) throw fuzz::Bug("read more elements than the file has bytes");
  });
}

// A checkpoint split over several safetensors files, as the Hugging Face hub stores every
// model past a few GB: `model.safetensors.index.json` = {"metadata": {...}, "weight_map":
// {tensor name: shard file name}}, the shards beside it. Read into one SafetensorsFile.
#pragma once

#include <string>

#include "train/safetensors.h"

namespace mt::train {

inline constexpr const char* kSafetensorsIndexName = "model.safetensors.index.json";

// Reads the index and every shard it names (each read by read_safetensors, so each is
// checked against its own size). The index is untrusted: a shard name that is not a plain
// `*.safetensors` file name in the index's folder (a path, "..", another extension), a
// tensor found in a shard the index does not map it to, a tensor in two shards, a mapped
// tensor missing from its shard, or an index over 64 MiB is refused with a message naming
// the index.
SafetensorsFile read_safetensors_shards(const std::string& index_path);

}  // namespace mt::train

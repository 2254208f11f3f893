// Hub checkpoints split over shards (model.safetensors.index.json): read as one file, and
// every way an untrusted index can point elsewhere refused with the index named.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/config.h"
#include "model/gpt.h"
#include "test_util.h"
#include "train/hf_export.h"
#include "train/safetensors.h"
#include "train/safetensors_shards.h"

namespace mt::train {
namespace {
namespace fs = std::filesystem;

std::string refusal(const std::function<void()>& read) {
  try {
    read();
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2) << e.what();
    return e.what();
  }
  return "no error";
}

void write_text(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }

// A llama-tiny export folder whose model.safetensors is split in two shards the way the hub
// splits (the first half of the names in shard 1), with its index; returns the folder and
// the original single file's tensors.
struct Sharded {
  fs::path folder;
  SafetensorsFile whole;
};
Sharded sharded_export(const std::string& name) {
  const fs::path folder = test::scratch_dir(name) / "llama";
  export_hf_safetensors(model::Gpt(model::preset("llama-tiny"), 7), folder.string());
  Sharded s{folder, read_safetensors((folder / "model.safetensors").string())};
  std::vector<NamedArray> part[2];
  nlohmann::json map = nlohmann::json::object();
  size_t i = 0;
  for (const auto& [tensor, array] : s.whole.arrays) {
    const int k = i++ < s.whole.arrays.size() / 2 ? 0 : 1;
    part[k].push_back(array);
    map[tensor] = k == 0 ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  write_safetensors((folder / "model-00001-of-00002.safetensors").string(), part[0], {});
  write_safetensors((folder / "model-00002-of-00002.safetensors").string(), part[1], {});
  fs::remove(folder / "model.safetensors");
  write_text(folder / kSafetensorsIndexName,
             nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", map}}.dump(1));
  return s;
}

TEST(HfShards, AShardedFolderReadsAsTheSingleFile) {
  const Sharded s = sharded_export("hf-shards-read");
  for (const std::string& given :
       {s.folder.string(), (s.folder / kSafetensorsIndexName).string()}) {
    const HfWeights w = read_hf_weights(given);
    EXPECT_EQ(w.path, (s.folder / kSafetensorsIndexName).string());
    EXPECT_EQ(w.config_path, (s.folder / "config.json").string());
    ASSERT_EQ(w.file.arrays.size(), s.whole.arrays.size());
    for (const auto& [tensor, array] : s.whole.arrays) {
      ASSERT_TRUE(w.file.arrays.count(tensor)) << tensor;
      EXPECT_EQ(w.file.arrays.at(tensor).shape, array.shape) << tensor;
      EXPECT_EQ(w.file.arrays.at(tensor).data, array.data) << tensor;  // bitwise
    }
    EXPECT_TRUE(config_from_hf(w, std::nullopt).same_model(model::preset("llama-tiny")));
  }
}

TEST(HfShards, AnIndexThatPointsElsewhereIsRefusedNamingIt) {
  const Sharded s = sharded_export("hf-shards-bad");
  const fs::path index = s.folder / kSafetensorsIndexName;
  const std::string good = [&] {
    std::ifstream in(index);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  auto with = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = nlohmann::json::parse(good);
    edit(j);
    write_text(index, j.dump());
    return refusal([&] { read_hf_weights(s.folder.string()); });
  };
  auto expect = [&](const std::string& message, const std::string& part) {
    EXPECT_NE(message.find(part), std::string::npos) << message;
    EXPECT_NE(message.find(index.string()), std::string::npos) << message;
  };
  const std::string t0 = s.whole.arrays.begin()->first;
  // Out of the folder, or not a safetensors name.
  for (const std::string bad : {"../model-00001-of-00002.safetensors", "/etc/passwd",
                                "sub/x.safetensors", "..", "model.bin", ""})
    expect(with([&](nlohmann::json& j) { j["weight_map"][t0] = bad; }),
           "which is not a file name ending in .safetensors");
  // A tensor the index maps to the other shard, or to none.
  expect(with([&](nlohmann::json& j) { j["weight_map"][t0] = "model-00002-of-00002.safetensors"; }),
         "holds tensor '" + t0 + "', which the index maps to 'model-00002-of-00002.safetensors'");
  expect(with([&](nlohmann::json& j) { j["weight_map"].erase(t0); }),
         "holds tensor '" + t0 + "', which the index maps to no shard");
  // A mapped tensor its shard does not hold.
  expect(with([&](nlohmann::json& j) {
           j["weight_map"]["model.layers.99.mlp.up_proj.weight"] =
               "model-00002-of-00002.safetensors";
         }),
         "maps tensor 'model.layers.99.mlp.up_proj.weight' to shard "
         "'model-00002-of-00002.safetensors', which does not hold it");
  // Not a map of names to strings.
  expect(with([&](nlohmann::json& j) { j["weight_map"][t0] = 3; }),
         "must map to a shard file name (a string)");
  expect(with([&](nlohmann::json& j) { j.erase("weight_map"); }), "non-empty \"weight_map\"");
  write_text(index, "{\"weight_map\": ");
  expect(refusal([&] { read_hf_weights(s.folder.string()); }), "is not valid JSON");
  // A shard that is missing is the shard's own refusal (read_safetensors names it).
  write_text(index, good);
  fs::remove(s.folder / "model-00002-of-00002.safetensors");
  const std::string m = refusal([&] { read_hf_weights(s.folder.string()); });
  EXPECT_NE(m.find("model-00002-of-00002.safetensors"), std::string::npos) << m;
  // A folder with neither file says what a model folder holds.
  fs::remove(index);
  const std::string none = refusal([&] { read_hf_weights(s.folder.string()); });
  EXPECT_NE(none.find("holds neither model.safetensors nor model.safetensors.index.json"),
            std::string::npos)
      << none;
}

}  // namespace
}  // namespace mt::train

// Distributed checkpoints (docs/checkpoints.md): the sharded save (index, atomic rename,
// latest, keep K), exact resume in the same layout (bitwise), resharding into other
// layouts (within the equivalence tolerance), damaged input, the offline reshard.
#include "train/checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/params.h"
#include "parallel/parallel3d_test_util.h"

namespace mt::test {
namespace {

namespace fs = std::filesystem;
using train::TrainOptions;
using train::TrainResult;
namespace ckpt = train::ckpt;

fs::path fresh(const std::string& name) {
  const fs::path d = dir3d() / name;
  fs::remove_all(d);
  return d;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return s;
}

// 8 steps with a checkpoint every 4 (and after the last).
TrainResult run_saving(const Layout3d& l, const fs::path& dir, int keep = 3) {
  TrainOptions o = options3d(l, 8);
  o.checkpoint_dir = dir.string();
  o.checkpoint_every = 4;
  o.keep_checkpoints = keep;
  o.keep_final_params = true;
  return train::run_training(o);
}

TrainResult run_resumed(const Layout3d& l, const fs::path& ckpt_dir) {
  TrainOptions o = options3d(l, 8);
  o.resume = ckpt_dir.string();
  o.keep_final_params = true;
  return train::run_training(o);
}

TEST(Checkpoint, Crc32cKnownValue) {
  // RFC 3720 (iSCSI), B.4: CRC32C of "123456789" is 0xE3069283.
  EXPECT_EQ(ckpt::crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(ckpt::crc32c("6789", 4, ckpt::crc32c("12345", 5)), 0xE3069283u);
}

TEST(Checkpoint, SavesShardsIndexLatestAndKeepsK) {
  const fs::path dir = fresh("save");
  const Layout3d l{.dp = 2, .tp = 2, .pp = 2, .zero = 1};
  run_saving(l, dir, /*keep=*/1);
  // keep 1: only step 8 is left; no temporary directory.
  EXPECT_EQ(ckpt::list_checkpoints(dir.string()),
            std::vector<std::string>{(dir / "step-00000008").string()});
  EXPECT_EQ(read_text(dir / "latest"), "step-00000008\n");
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  const ckpt::Index idx = ckpt::read_index((dir / "step-00000008").string());
  EXPECT_EQ(idx.step, 8);
  EXPECT_EQ(idx.adam_steps, 8);
  EXPECT_EQ(idx.dp, 2);
  EXPECT_EQ(idx.tp, 2);
  EXPECT_EQ(idx.pp, 2);
  // ZeRO-1: every one of the 8 ranks writes its shard.
  EXPECT_EQ(idx.files.size(), 8u);
  EXPECT_TRUE(ckpt::verify(idx).empty());
  // Every element of every tensor is saved once: master + m + v, 4 bytes each, plus headers.
  int64_t elems = 0;
  for (const ckpt::Piece& p : idx.pieces) elems += p.elems();
  model::GptConfig c = idx.config;
  c.vocab_pad_multiple = model::tp_vocab_pad(2);
  EXPECT_EQ(elems, model::count_params(model::gpt_param_specs(c)));
  EXPECT_GT(idx.data_bytes(), elems * 12);
}

// Same layout: the continued run's losses and final weights are bitwise the uninterrupted
// run's.
class ExactResume : public ::testing::TestWithParam<Layout3d> {};

TEST_P(ExactResume, BitwiseSameLossesAndWeights) {
  const Layout3d l = GetParam();
  const fs::path dir = fresh("exact_" + name_of(l));
  const TrainResult full = run_saving(l, dir);
  const TrainResult cont = run_resumed(l, dir / "step-00000004");
  EXPECT_EQ(cont.start_step, 4);
  ASSERT_EQ(cont.steps.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(cont.steps[i].step, full.steps[i + 4].step);
    EXPECT_EQ(cont.steps[i].loss, full.steps[i + 4].loss) << "step " << cont.steps[i].step;
    EXPECT_EQ(cont.steps[i].grad_norm, full.steps[i + 4].grad_norm);
  }
  ASSERT_EQ(cont.ranks.size(), full.ranks.size());
  for (size_t r = 0; r < full.ranks.size(); ++r)
    EXPECT_TRUE(cont.ranks[r].final_params == full.ranks[r].final_params) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Layouts, ExactResume,
                         ::testing::Values(Layout3d{}, Layout3d{.dp = 2, .zero = 0},
                                           Layout3d{.dp = 2, .zero = 3},
                                           Layout3d{.dp = 2, .tp = 2, .pp = 2, .zero = 1},
                                           Layout3d{.dp = 2, .tp = 2, .zero = 2, .sp = true}),
                         [](const auto& info) { return name_of(info.param); });

// Resharding: saved under dp2 tp2 pp2 ZeRO-1, continued under other layouts.
class Reshard : public ::testing::TestWithParam<Layout3d> {};

TEST_P(Reshard, ContinuesWithinTheEquivalenceTolerance) {
  static const fs::path dir = fresh("reshard_src");
  static const TrainResult full = run_saving({.dp = 2, .tp = 2, .pp = 2, .zero = 1}, dir);
  const TrainResult cont = run_resumed(GetParam(), dir / "step-00000004");
  ASSERT_EQ(cont.steps.size(), 4u);
  for (size_t i = 0; i < 4; ++i)
    // 5e-5: the 3D equivalence tolerance of the loss (parallel3d_equiv_test: layouts differ
    // from the single rank by summation order only, ~1e-6 on this model).
    EXPECT_NEAR(cont.steps[i].loss, full.steps[i + 4].loss, 5e-5) << "step " << i + 5;
}

INSTANTIATE_TEST_SUITE_P(Layouts, Reshard,
                         ::testing::Values(Layout3d{}, Layout3d{.dp = 4, .zero = 3},
                                           Layout3d{.tp = 2, .pp = 2},
                                           Layout3d{.dp = 2, .tp = 4, .zero = 2},
                                           Layout3d{.tp = 3, .pp = 2, .zero = 0}),
                         [](const auto& info) { return name_of(info.param); });

TEST(Checkpoint, OfflineReshardLoadsLikeTheOriginal) {
  const fs::path src = fresh("offline_src"), out = fresh("offline_out");
  const Layout3d saved{.dp = 2, .tp = 2, .zero = 3};
  const TrainResult full = run_saving(saved, src);
  const ckpt::Index idx = ckpt::read_index((src / "step-00000004").string());
  TrainOptions target = options3d({.dp = 1, .tp = 1, .pp = 2}, 8);
  EXPECT_EQ(ckpt::write_resharded(idx, ckpt::load_global(idx), target, out.string()), 2);
  const ckpt::Index re = ckpt::read_index((out / "step-00000004").string());
  EXPECT_TRUE(ckpt::verify(re).empty());
  EXPECT_EQ(re.pp, 2);
  const TrainResult cont = run_resumed({.pp = 2}, out / "step-00000004");
  ASSERT_EQ(cont.steps.size(), 4u);
  for (size_t i = 0; i < 4; ++i)
    EXPECT_NEAR(cont.steps[i].loss, full.steps[i + 4].loss, 5e-5);  // as Reshard
}

// ---- damaged input --------------------------------------------------------------------

void flip_byte(const fs::path& file, int64_t at) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(at);
  f.write(&c, 1);
}

std::string error_of(const TrainOptions& o) {
  try {
    train::run_training(o);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

struct Damaged : ::testing::Test {
  const Layout3d l{.dp = 2, .zero = 1};
  fs::path dir;
  TrainResult full;
  void SetUp() override {
    dir = fresh(std::string("damaged_") +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
    full = run_saving(l, dir);
  }
  fs::path newest() const { return dir / "step-00000008"; }
  fs::path shard1() const { return newest() / "rank-00001.safetensors"; }
  TrainOptions resume(const std::string& what) const {
    TrainOptions o = options3d(l, 8);
    o.checkpoint_dir = dir.string();
    o.resume = what;
    return o;
  }
};

TEST_F(Damaged, CorruptShardIsNamedAndAutoFallsBack) {
  flip_byte(shard1(), static_cast<int64_t>(fs::file_size(shard1())) - 100);
  const std::string e = error_of(resume(newest().string()));
  EXPECT_NE(e.find("rank-00001.safetensors' is damaged"), std::string::npos) << e;
  EXPECT_NE(e.find("checksum"), std::string::npos) << e;
  // auto: step 8 is damaged, step 4 is used; the run continues from there.
  TrainOptions o = resume("auto");
  o.keep_final_params = true;
  const TrainResult cont = train::run_training(o);
  EXPECT_EQ(cont.start_step, 4);
  ASSERT_EQ(cont.steps.size(), 4u);
  EXPECT_EQ(cont.steps.back().loss, full.steps.back().loss);
}

TEST_F(Damaged, TruncatedShardIsNamed) {
  fs::resize_file(shard1(), fs::file_size(shard1()) - 1000);
  const std::string e = error_of(resume(newest().string()));
  EXPECT_NE(e.find("rank-00001.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  EXPECT_EQ(train::run_training(resume("auto")).start_step, 4);
}

TEST_F(Damaged, MissingShardIsNamed) {
  fs::remove(shard1());
  const std::string e = error_of(resume(newest().string()));
  EXPECT_NE(e.find("rank-00001.safetensors' is missing"), std::string::npos) << e;
  EXPECT_EQ(train::run_training(resume("auto")).start_step, 4);
}

TEST_F(Damaged, CorruptIndexIsNamed) {
  flip_byte(newest() / "index.json", 5);
  const std::string e = error_of(resume(newest().string()));
  EXPECT_NE(e.find("index.json"), std::string::npos) << e;
  EXPECT_EQ(train::run_training(resume("auto")).start_step, 4);
}

TEST_F(Damaged, AnotherModelIsRefused) {
  TrainOptions o = resume(newest().string());
  o.model.n_layer = 2;
  const std::string e = error_of(o);
  EXPECT_NE(e.find("holds another model"), std::string::npos) << e;
  // auto: no checkpoint in DIR fits, which is an error, not a silent fresh start.
  o.resume = "auto";
  EXPECT_NE(error_of(o).find("no loadable checkpoint"), std::string::npos);
}

TEST_F(Damaged, AnotherGlobalBatchIsRefused) {
  TrainOptions o = resume(newest().string());
  o.batch = 32;  // step x batch would no longer be the data position
  const std::string e = error_of(o);
  EXPECT_NE(e.find("was trained with --batch 16 and this run asks for --batch 32"),
            std::string::npos)
      << e;
}

TEST_F(Damaged, AutoWithAnEmptyDirectoryStartsFromScratch) {
  TrainOptions o = resume("auto");
  o.checkpoint_dir = fresh("damaged_empty").string();
  EXPECT_EQ(train::run_training(o).start_step, 0);
}

// ---- an index from elsewhere (tests/fuzz/checkpoint_index_fuzz.cpp, docs/fuzzing.md) -------

// A small checkpoint written offline (no training): dp 1 tp 2, batch 2, as the fuzz harness
// makes its own. Returns its step directory.
fs::path small_checkpoint(const std::string& name) {
  ckpt::Index idx;
  idx.dir = name;
  idx.config.name = "small";
  idx.config.n_layer = 1;
  idx.config.n_head = 2;
  idx.config.d_model = 4;
  idx.config.d_ff = 8;
  idx.config.vocab = 5;
  idx.config.seq_len = 4;
  idx.step = 1;
  idx.batch = 2;
  idx.json_text = R"({"trainer": {"adam_steps": 1, "seed": 7, "batch": 2}})";
  ckpt::GlobalState st;
  st.specs = model::gpt_param_specs(idx.config);
  for (int k = 0; k < ckpt::kArrays; ++k)
    for (const model::ParamSpec& s : st.specs)
      st.arrays[k].emplace_back(static_cast<size_t>(shape_numel(s.shape)), 0.5f * k);
  TrainOptions o;
  o.model = idx.config;
  o.batch = 2;
  o.tp = 2;
  const fs::path out = fresh(name);
  ckpt::write_resharded(idx, st, o, out.string());
  return out / "step-00000001";
}

// Rewrites the checkpoint's index.json through `edit`.
void edit_index(const fs::path& step, const std::function<void(nlohmann::json&)>& edit) {
  std::ifstream in(step / "index.json");
  nlohmann::json j = nlohmann::json::parse(in);
  in.close();
  edit(j);
  std::ofstream(step / "index.json") << j.dump();
}

// Edits a copy of the small checkpoint's index; returns read_index's refusal.
std::string index_refusal(const fs::path& step, const std::function<void(nlohmann::json&)>& edit) {
  const fs::path copy = step.parent_path() / "edited";
  fs::remove_all(copy);
  fs::copy(step, copy);
  edit_index(copy, edit);
  try {
    ckpt::read_index(copy.string());
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2) << e.what();
    EXPECT_NE(std::string(e.what()).find((copy / "index.json").string()), std::string::npos)
        << e.what();
    return e.what();
  }
  return "no error";
}

// Found by the fuzzer (tests/fuzz/checkpoint_index_fuzz.cpp, within 3 minutes on the code
// before): refusals that did not name the checkpoint, from deep inside reshard and export
// ("--d-ff 0 must be at least 1"; "transformer.h.0.mlp.c_proj.weight: dimension 1 of size 8
// does not split over 3 tensor-parallel ranks"). Now read_index checks both.
TEST(IndexFromElsewhere, FuzzFoundRefusalsNameTheCheckpoint) {
  const fs::path step = small_checkpoint("index_fuzz_found");
  std::string m = index_refusal(step, [](nlohmann::json& j) { j["config"]["d_ff"] = 0; });
  EXPECT_NE(m.find("config.d_ff must be an integer in [1, "), std::string::npos) << m;
  m = index_refusal(step, [](nlohmann::json& j) {
    for (nlohmann::json& p : j["pieces"])
      if (p["tensor"] == "transformer.h.0.mlp.c_proj.weight") p["tp"] = {0, 3};
  });
  EXPECT_NE(m.find("a piece of 'transformer.h.0.mlp.c_proj.weight' is of tp rank 0 of 3: "
                   "transformer.h.0.mlp.c_proj.weight: dimension 1 of size 8 does not split"),
            std::string::npos)
      << m;
}

// Found by reading (each checked with the fuzz harness on the code before): an index's
// numbers were taken with nlohmann's get<int64_t>() / get<int>(): 1e19 is undefined
// behaviour, 2^32 + 1 wrapped to 1.
TEST(IndexFromElsewhere, NumbersOutOfRangeAreRefusedNotConverted) {
  const fs::path step = small_checkpoint("index_numbers");
  EXPECT_EQ(index_refusal(step, [](nlohmann::json&) {}), "no error");
  std::string m = index_refusal(step, [](nlohmann::json& j) { j["step"] = 1e19; });
  EXPECT_NE(m.find("step must be an integer in [0, "), std::string::npos) << m;
  m = index_refusal(step, [](nlohmann::json& j) { j["layout"]["dp"] = (int64_t{1} << 32) + 1; });
  EXPECT_NE(m.find("layout.dp must be an integer in [1, 2147483647]"), std::string::npos) << m;
  m = index_refusal(step,
                    [](nlohmann::json& j) { j["pieces"][0]["crc32c"][1] = int64_t{1} << 33; });
  EXPECT_NE(m.find("a piece's CRC32C must be an integer in [0, 4294967295]"), std::string::npos)
      << m;
  m = index_refusal(step, [](nlohmann::json& j) { j["pieces"][0]["local"] = {4, 2}; });
  EXPECT_NE(m.find("a piece's end element must be an integer in [5, "), std::string::npos) << m;
}

// Found by the checkpoint harness's seed model-larger-than-files (libFuzzer's malloc limit:
// reshard and export allocated the model the index names, 10^6 blocks, before reading
// anything) and by reading (a model of d_model 10^15 + 1 and 2 heads: GptConfig::validate
// listed the valid head counts by a scan up to d_model, a hang; the fix is in
// model/config.cpp).
TEST(IndexFromElsewhere, AModelLargerThanItsShardFilesIsRefused) {
  const fs::path step = small_checkpoint("index_model");
  std::string m = index_refusal(step, [](nlohmann::json& j) { j["config"]["n_layer"] = 1000000; });
  EXPECT_NE(m.find("its model has 1000000 blocks but it lists only 16 tensors"), std::string::npos)
      << m;
  m = index_refusal(step, [](nlohmann::json& j) { j["config"]["d_model"] = 1000000000000001; });
  EXPECT_NE(m.find("needs more than the"), std::string::npos) << m;
  // A listed tensor that is not the model's: before, tp_split "cols" on a 1-D tensor read
  // past its shape (AddressSanitizer: heap-buffer-overflow in tp_shard_specs).
  m = index_refusal(step, [](nlohmann::json& j) {
    j["tensors"]["transformer.ln_f.weight"]["tp_split"] = "cols";
  });
  EXPECT_NE(m.find("tensor 'transformer.ln_f.weight' is listed as [4] (cols), but its model's is "
                   "[4] (replicated)"),
            std::string::npos)
      << m;
}

// Found by reading: a piece's elements and offsets were checked only when read: `inspect`
// (verify) allocated the elements a piece claims (2^40: 4 TiB) first, and read again the
// bytes of pieces repeated (a small index could make it read terabytes).
TEST(IndexFromElsewhere, PiecesOutsideTheirTensorOrFileAreRefused) {
  const fs::path step = small_checkpoint("index_pieces");
  std::string m = index_refusal(step, [](nlohmann::json& j) {
    j["pieces"][0]["local"] = {0, int64_t{1} << 40};
  });
  EXPECT_NE(m.find("claims elements [0, 1099511627776) of a 256-element slice"), std::string::npos)
      << m;
  m = index_refusal(step, [](nlohmann::json& j) {
    j["pieces"][1]["offsets"][2] = j["files"][0]["bytes"].get<int64_t>() - 4;
  });
  EXPECT_NE(m.find("adam_v of a piece of"), std::string::npos) << m;
  m = index_refusal(step, [](nlohmann::json& j) { j["pieces"][0]["tp"] = {2, 2}; });
  EXPECT_NE(m.find("a piece's tp rank must be an integer in [0, 1]"), std::string::npos) << m;
  // The same data claimed twice: a file listed again (the model's size is bounded by the
  // files' bytes), a piece's bytes claimed by another (inspect would read them again).
  m = index_refusal(step, [](nlohmann::json& j) { j["files"].push_back(j["files"][0]); });
  EXPECT_NE(m.find("it lists shard file 'rank-00000.safetensors' twice"), std::string::npos) << m;
  m = index_refusal(step, [](nlohmann::json& j) { j["pieces"].push_back(j["pieces"][1]); });
  EXPECT_NE(m.find("pieces of 'transformer.wpe.weight' and 'transformer.wpe.weight' overlap"),
            std::string::npos)
      << m;
}

// Found by reading: the files an index names were opened wherever they pointed.
TEST(IndexFromElsewhere, ShardNamesOutsideTheCheckpointAreRefused) {
  const fs::path step = small_checkpoint("index_names");
  for (const char* name : {"../rank-00000.safetensors", "/etc/passwd", "..", ""}) {
    const std::string m =
        index_refusal(step, [&](nlohmann::json& j) { j["files"][0]["name"] = name; });
    EXPECT_NE(m.find("not a file name in the checkpoint directory"), std::string::npos) << m;
  }
}

// Found by reading: an index nested a million levels deep (2 MB) overflowed the stack when
// read_index wrote it back as text (nlohmann's dump recurses).
TEST(IndexFromElsewhere, DeepNestingIsRefusedNotAStackOverflow) {
  const fs::path step = small_checkpoint("index_deep");
  const int depth = 1'000'000;
  std::string text;
  {
    std::ifstream in(step / "index.json");
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  text.insert(text.find('{') + 1,
              R"("x": )" + std::string(depth, '[') + std::string(depth, ']') + ", ");
  std::ofstream(step / "index.json") << text;
  try {
    ckpt::read_index(step.string());
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nested more than 64 levels"), std::string::npos)
        << e.what();
  }
}

// Found by reading (confirmed with the checkpoint harness: libFuzzer's timeout): a batch of
// 2^61 - 1 (a prime) made reshard's suggestion of a --dp and its choice of a microbatch
// count scan up to the batch.
TEST(IndexFromElsewhere, APrimeBatchIsRefusedAtOnce) {
  const fs::path step = small_checkpoint("index_prime");
  edit_index(step, [](nlohmann::json& j) { j["trainer"]["batch"] = (int64_t{1} << 61) - 1; });
  const ckpt::Index idx = ckpt::read_index(step.string());
  TrainOptions o;
  o.model = idx.config;
  o.tp = 2;
  o.dp = 2;
  try {
    ckpt::check_resumable(idx, o);
    FAIL() << "dp 2 accepted for an odd batch";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("choose a --dp among 1, ..."), std::string::npos)
        << e.what();
  }
  o.dp = 1;
  o.pipeline.pp = 2;
  try {
    ckpt::check_resumable(idx, o);
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2) << e.what();
  }
}

}  // namespace
}  // namespace mt::test

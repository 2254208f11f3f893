#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "test_util.h"
#include "train/hf_export.h"
#include "train/safetensors.h"
#include "train/token_corpus.h"

namespace mt::train {
namespace {

// The message of the mt::Error (exit code 2) that `read` throws; "no error" if none.
std::string refusal(const std::function<void()>& read) {
  try {
    read();
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2) << e.what();
    return e.what();
  }
  return "no error";
}

// A safetensors file of `header` (JSON text, as is) and `data`.
std::string raw_safetensors(const std::string& path, const std::string& header,
                            const std::string& data = "") {
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header << data;
  return path;
}

TEST(TokenFile, RoundTripAndLlmcBatchOrder) {
  auto dir = test::scratch_dir("tokens");
  std::vector<uint16_t> tokens(100);
  for (int i = 0; i < 100; ++i) tokens[i] = static_cast<uint16_t>(i);
  const std::string path = (dir / "t.bin").string();
  write_token_file(path, tokens);
  EXPECT_EQ(std::filesystem::file_size(path), 1024u + 200u);
  TokenFile f(path, 256);
  ASSERT_EQ(f.num_tokens(), 100);
  // llm.c: batch k reads tokens [k*B*T, (k+1)*B*T + 1).
  const int64_t B = 2, T = 5;
  SequenceSampler s(f, T, 0, (100 - 1) / T);
  std::vector<int32_t> in(B * T), tgt(B * T);
  s.fill(3 * B, B, in.data(), tgt.data());
  for (int i = 0; i < B * T; ++i) {
    EXPECT_EQ(in[i], 3 * B * T + i);
    EXPECT_EQ(tgt[i], 3 * B * T + i + 1);
  }
}

TEST(TokenFile, RefusesBadFilesWithTheReason) {
  auto dir = test::scratch_dir("badtokens");
  auto message = [](const std::string& path, int64_t vocab) {
    try {
      TokenFile f(path, vocab);
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), 2);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message((dir / "missing.bin").string(), 256).find("cannot open"), std::string::npos);
  const std::string path = (dir / "t.bin").string();
  write_token_file(path, {1, 2, 300});
  EXPECT_NE(message(path, 256).find("token 300 at position 2"), std::string::npos);
  // The fix names the file's largest token, not the first one out of range: one retry.
  write_token_file(path, {1, 300, 2, 500, 3});
  const std::string m = message(path, 256);
  EXPECT_NE(m.find("token 300 at position 1"), std::string::npos) << m;
  EXPECT_NE(m.find("the largest token in the file is 500: use --vocab 501 or more"),
            std::string::npos)
      << m;
  std::filesystem::resize_file(path, 1024 + 4);  // truncated
  EXPECT_NE(message(path, 512).find("damaged"), std::string::npos);
  std::ofstream((dir / "text.bin").string()) << "hello, this is not a token file";
  EXPECT_NE(message((dir / "text.bin").string(), 256).find("header"), std::string::npos);
}

TEST(Safetensors, RoundTripAndDamage) {
  auto dir = test::scratch_dir("st");
  const std::string path = (dir / "w.safetensors").string();
  write_safetensors(path, {{"a", {2, 3}, {1, 2, 3, 4, 5, 6}}, {"b", {1}, {-7.5f}}}, {{"k", "v"}});
  SafetensorsFile f = read_safetensors(path);
  EXPECT_EQ(f.metadata.at("k"), "v");
  EXPECT_EQ(f.arrays.at("a").shape, (Shape{2, 3}));
  EXPECT_EQ(f.arrays.at("a").data[5], 6.f);
  EXPECT_EQ(f.arrays.at("b").data[0], -7.5f);
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 2);
  try {
    read_safetensors(path);
    FAIL() << "a truncated file was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
}

// n_head is not in the tensor shapes: the file's metadata says it, a hint only where the
// file does not record it, and a hint that disagrees with the file is refused.
TEST(HfConfig, NHeadFromTheFileAndAHintOnlyWhereItIsMissing) {
  model::GptConfig c;
  c.n_layer = 1;
  c.n_head = 4;
  c.d_model = 64;
  c.d_ff = 256;
  c.vocab = 256;
  c.seq_len = 32;
  const std::string path = (test::scratch_dir("hfconfig") / "w.safetensors").string();
  export_hf_safetensors(model::Gpt(c, 1), path);
  SafetensorsFile f = read_safetensors(path);
  f.metadata.erase("n_head");
  auto refusal = [&](std::optional<int64_t> hint) {
    try {
      config_from_hf(f, "w.safetensors", hint);
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), 2);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(refusal(std::nullopt).find("does not record n_head"), std::string::npos);
  EXPECT_EQ(config_from_hf(f, "w.safetensors", 2).n_head, 2);
  f.metadata["n_head"] = "4";
  EXPECT_EQ(config_from_hf(f, "w.safetensors", std::nullopt).n_head, 4);
  EXPECT_EQ(config_from_hf(f, "w.safetensors", 4).n_head, 4);
  const std::string m = refusal(2);
  EXPECT_NE(m.find("--n-head 2 disagrees with n_head 4 recorded in weights file 'w.safetensors'"),
            std::string::npos)
      << m;
}

// Found by the fuzzer (tests/fuzz/safetensors_fuzz.cpp; its smallest crashing input, 8
// bytes): a header length of 2^64 - 393 216 + ..., past the file's end, was cast to a negative
// int64, passed the check and was allocated (std::length_error, not a refusal).
TEST(Safetensors, FuzzFoundHeaderLengthPastTheFileIsRefused) {
  const std::string path = (test::scratch_dir("st-fuzz") / "w.safetensors").string();
  std::ofstream(path, std::ios::binary) << std::string("\x10\x00\x00\x06\x00\x00\xfa\xff", 8);
  EXPECT_NE(refusal([&] { read_safetensors(path); }).find("bad header length"), std::string::npos);
}

// Found by reading (the fuzz harness then checked): numbers the header gives are integers in
// range, else refused. Before: 1e19 converted to int64 (undefined behaviour), a shape whose
// product overflows int64 (undefined), negative dimensions accepted.
TEST(Safetensors, NumbersOutOfRangeAreRefusedNotConverted) {
  const auto dir = test::scratch_dir("st-numbers");
  auto refused = [&](const std::string& header, const std::string& data) {
    const std::string path = raw_safetensors((dir / "w.safetensors").string(), header, data);
    return refusal([&] { read_safetensors(path); });
  };
  std::string m =
      refused(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,1e19]}})", std::string(4, '\0'));
  EXPECT_NE(m.find("tensor 'a': data_offsets[1] must be an integer"), std::string::npos) << m;
  m = refused(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}})",
              "");
  EXPECT_NE(m.find("more elements than an int64 counts"), std::string::npos) << m;
  m = refused(R"({"a":{"dtype":"F32","shape":[4611686018427387904,2],"data_offsets":[0,0]}})", "");
  EXPECT_NE(m.find("more elements than an int64 counts"), std::string::npos) << m;
  m = refused(R"({"a":{"dtype":"F32","shape":[-1,-4],"data_offsets":[0,16]}})",
              std::string(16, '\0'));
  EXPECT_NE(m.find("a dimension of its shape must be an integer in [0, "), std::string::npos) << m;
  m = refused(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":[1]})",
              std::string(8, '\0'));
  EXPECT_NE(m.find("__metadata__ must be a JSON object"), std::string::npos) << m;
}

// Found by reading: tensors that share bytes made the reader decode the same bytes once per
// tensor: a header of 10 000 entries over one 1 MB tensor would have allocated 40 GB.
TEST(Safetensors, OverlappingTensorsAreRefused) {
  const std::string path =
      raw_safetensors((test::scratch_dir("st-overlap") / "w.safetensors").string(),
                      R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                      std::string(16, '\0'));
  const std::string m = refusal([&] { read_safetensors(path); });
  EXPECT_NE(m.find("tensors 'a' and 'b' overlap"), std::string::npos) << m;
}

// Found by reading: a header nested a million levels deep (a 2 MB file) overflowed the stack
// when its metadata value was printed (nlohmann's dump recurses).
TEST(Safetensors, DeepNestingIsRefusedNotAStackOverflow) {
  const int depth = 1'000'000;
  const std::string path = raw_safetensors(
      (test::scratch_dir("st-deep") / "w.safetensors").string(),
      R"({"__metadata__":{"k":)" + std::string(depth, '[') + std::string(depth, ']') + "}}");
  const std::string m = refusal([&] { read_safetensors(path); });
  EXPECT_NE(m.find("nested more than 64 levels"), std::string::npos) << m;
}

// An export of this model, as eval reads it (the hf_weights fuzz harness's path).
SafetensorsFile small_hf_file(const std::string& name) {
  model::GptConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 8;
  c.d_ff = 16;
  c.vocab = 11;
  c.seq_len = 4;
  const std::string path = (test::scratch_dir(name) / "w.safetensors").string();
  export_hf_safetensors(model::Gpt(c, 1), path);
  return read_safetensors(path);
}

// Found by the fuzzer (tests/fuzz/hf_weights_fuzz.cpp) on files of GPT-2 names whose tensors
// or metadata do not make a model: each threw something else than a refusal naming the file.
TEST(HfConfig, FuzzFoundFilesThatMakeNoModelAreRefusedNamingTheFile) {
  const SafetensorsFile good = small_hf_file("hf-fuzz");
  auto refused = [&](const SafetensorsFile& f) {
    return refusal([&] { config_from_hf(f, "w.safetensors", std::nullopt); });
  };
  EXPECT_EQ(config_from_hf(good, "w.safetensors", std::nullopt).n_layer, 2);
  // mlp.c_fc.weight one-dimensional: shape.at(1) threw std::out_of_range.
  SafetensorsFile f = good;
  f.arrays["transformer.h.0.mlp.c_fc.weight"].shape = {8};
  std::string m = refused(f);
  EXPECT_NE(m.find("weights file 'w.safetensors': tensor 'transformer.h.0.mlp.c_fc.weight' has "
                   "shape [8]; GPT-2's has 2 dimensions"),
            std::string::npos)
      << m;
  // n_head "0" in the metadata: "--n-head 0 must be at least 1", without the file.
  f = good;
  f.metadata["n_head"] = "0";
  m = refused(f);
  EXPECT_NE(m.find("weights file 'w.safetensors' records n_head '0'"), std::string::npos) << m;
  // No block left (their names damaged): "--n-layer 0 must be at least 1", without the file.
  f = good;
  for (auto it = f.arrays.begin(); it != f.arrays.end();)
    it = it->first.find(".h.") != std::string::npos ? f.arrays.erase(it) : std::next(it);
  m = refused(f);
  EXPECT_NE(m.find("weights file 'w.safetensors' describes no valid GPT model: --n-layer 0"),
            std::string::npos)
      << m;
}

// Found by reading: the metadata's n_head and the block numbers went through std::stoll
// (std::invalid_argument / std::out_of_range, not refusals), and a name claiming block
// 10^9 made a model of 10^9 blocks that the file does not hold (allocated before the
// missing tensors were noticed). Now every tensor of the model is checked in the file
// before the model is built.
TEST(HfConfig, ClaimsTheFileDoesNotHoldAreRefused) {
  const SafetensorsFile good = small_hf_file("hf-claims");
  auto refused = [&](const SafetensorsFile& f) {
    return refusal([&] { config_from_hf(f, "w.safetensors", std::nullopt); });
  };
  SafetensorsFile f = good;
  f.metadata["n_head"] = "two";
  EXPECT_NE(refused(f).find("records n_head 'two' in its metadata: not a positive integer"),
            std::string::npos);
  f = good;
  f.arrays["transformer.h.99999999999999999999.ln_1.weight"] = {"", {8}, {}};
  EXPECT_NE(refused(f).find("names block 99999999999999999999, but the file holds"),
            std::string::npos);
  f = good;
  f.arrays["transformer.h.5.ln_1.weight"] = {"", {8}, {}};
  EXPECT_NE(refused(f).find("has tensors of block 5 but not of all the blocks before it"),
            std::string::npos);
  f = good;
  f.arrays.erase("transformer.h.1.attn.c_proj.weight");
  EXPECT_NE(refused(f).find("has no tensor 'transformer.h.1.attn.c_proj.weight'"),
            std::string::npos);
}

// A small Llama exported as a folder (model.safetensors + config.json), as eval --weights
// and train --init-from read it (the hf_llama fuzz harness's path).
model::GptConfig small_llama(int64_t kv_heads, bool tied, bool bias) {
  model::GptConfig c;
  c.name = "llama-io";
  c.n_layer = 2;
  c.n_head = 2;
  c.n_kv_head = kv_heads;
  c.d_model = 8;
  c.d_ff = 12;
  c.vocab = 11;
  c.seq_len = 16;
  c.bias = bias;
  c.tied = tied;
  c.norm = model::NormKind::kRmsNorm;
  c.mlp = model::MlpKind::kSwiGlu;
  c.positions = model::Positions::kRope;
  return c;
}

std::string export_llama_folder(const model::GptConfig& c, const std::string& name) {
  const std::string dir = (test::scratch_dir(name) / "llama").string();
  export_hf_safetensors(model::Gpt(c, 1), dir);
  return dir;
}

// Rewrites one field of the folder's config.json (`value` as JSON text).
void edit_config(const std::string& dir, const std::string& key, const std::string& value) {
  const std::string path = dir + "/config.json";
  nlohmann::json j;
  std::ifstream(path) >> j;
  j[key] = nlohmann::json::parse(value);
  std::ofstream(path, std::ios::trunc) << j.dump();
}

// Found writing the hf_llama fuzz harness: a config.json claiming more than its weights file
// holds was believed until the tensors were looked up: 10^6 layers built 9 * 10^6 parameter
// specs first (gigabytes), max_position_embeddings 2^31 would have built 16 GB of rotary
// tables with the model. Now the config's parameter count must be values the file holds
// (exactly counted: one layer more is refused, every exported layout is read) and the rotary
// tables at most the weights in f32 or 64 MiB.
TEST(HfLlamaConfig, AConfigLargerThanItsWeightsIsRefusedBeforeTheModelIsBuilt) {
  for (const auto& [kv, tied, bias] : {std::tuple{1, false, false}, std::tuple{2, true, false},
                                       std::tuple{1, true, true}, std::tuple{2, false, true}}) {
    const model::GptConfig c = small_llama(kv, tied, bias);
    const std::string dir = export_llama_folder(c, "llama-fits");
    EXPECT_TRUE(config_from_hf(read_hf_weights(dir), std::nullopt).same_model(c))
        << "kv " << kv << " tied " << tied << " bias " << bias;
    edit_config(dir, "num_hidden_layers", "3");
    const std::string m = refusal([&] { config_from_hf(read_hf_weights(dir), std::nullopt); });
    EXPECT_NE(m.find("describes a model of"), std::string::npos) << m;
    EXPECT_NE(
        m.find("(num_hidden_layers 3, hidden_size 8, intermediate_size 12, vocab_size 11), but "
               "weights file '" +
               dir + "/model.safetensors' holds"),
        std::string::npos)
        << m;
  }
  const std::string dir = export_llama_folder(small_llama(1, false, false), "llama-claims");
  edit_config(dir, "num_hidden_layers", "1000000");
  std::string m = refusal([&] { config_from_hf(read_hf_weights(dir), std::nullopt); });
  EXPECT_NE(m.find("config '" + dir + "/config.json' describes a model of"), std::string::npos)
      << m;
  edit_config(dir, "num_hidden_layers", "2");
  edit_config(dir, "max_position_embeddings", "131072");  // Llama 3.1's: 2 MiB of tables
  EXPECT_EQ(config_from_hf(read_hf_weights(dir), std::nullopt).seq_len, 131072);
  edit_config(dir, "max_position_embeddings", "2147483648");
  m = refusal([&] { config_from_hf(read_hf_weights(dir), std::nullopt); });
  EXPECT_NE(m.find("max_position_embeddings 2147483648 makes rotary tables"), std::string::npos)
      << m;
}

// Found by reading (the hf_llama fuzz harness's seeds eps-past-float and head-dim-overflow
// then checked under UBSan): rms_norm_eps 1e300 was converted to float (undefined
// behaviour), head_dim 2^62 multiplied by the heads (a signed overflow, undefined), and an
// integer of 2^64 - 1 read as -1.
TEST(HfLlamaConfig, NumbersOutOfRangeAreRefusedNotConverted) {
  const std::string dir = export_llama_folder(small_llama(1, false, false), "llama-numbers");
  auto refused = [&](const std::string& key, const std::string& value) {
    edit_config(dir, key, value);
    const std::string m = refusal([&] { config_from_hf(read_hf_weights(dir), std::nullopt); });
    EXPECT_NE(m.find("config '" + dir + "/config.json'"), std::string::npos) << m;
    return m;
  };
  std::string m = refused("rms_norm_eps", "1e300");
  EXPECT_NE(m.find("rms_norm_eps 1e+300 must be a positive float"), std::string::npos) << m;
  edit_config(dir, "rms_norm_eps", "1e-5");
  m = refused("head_dim", "4611686018427387904");
  EXPECT_NE(m.find("head_dim 4611686018427387904 x num_attention_heads 2 must equal "
                   "hidden_size 8"),
            std::string::npos)
      << m;
  edit_config(dir, "head_dim", "4");
  m = refused("num_key_value_heads", "18446744073709551615");
  EXPECT_NE(m.find("num_key_value_heads must be an integer in"), std::string::npos) << m;
}

}  // namespace
}  // namespace mt::train

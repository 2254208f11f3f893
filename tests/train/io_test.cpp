#include <gtest/gtest.h>

#include <fstream>

#include "core/error.h"
#include "test_util.h"
#include "train/hf_export.h"
#include "train/safetensors.h"
#include "train/token_file.h"

namespace mt::train {
namespace {

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
  SafetensorsFile f;
  f.arrays["transformer.wte.weight"] = {"transformer.wte.weight", {256, 64}, {}};
  f.arrays["transformer.wpe.weight"] = {"transformer.wpe.weight", {32, 64}, {}};
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

}  // namespace
}  // namespace mt::train

// Bad input gets a clear error naming the value and the fix, exit code 2 (1 for a failure
// while running), and nothing half-written.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "test_util.h"

namespace mt {
namespace {

class CliErrors : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(test::scratch_dir("cli"));
    data_ = new std::string(test::demo_tokens(*dir_));
  }
  static std::filesystem::path* dir_;
  static std::string* data_;
  void expect_refused(const std::string& args, int code, const std::string& says) {
    auto r = test::run_meshtrain(args);
    EXPECT_EQ(r.exit_code, code) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(says), std::string::npos) << args << "\n" << r.output;
  }
};
std::filesystem::path* CliErrors::dir_ = nullptr;
std::string* CliErrors::data_ = nullptr;

TEST_F(CliErrors, RefusesBadModelsAndData) {
  const std::string d = " --data " + *data_ + " --steps 1 --peak-gflops 100";
  expect_refused("train --model gpt5" + d, 2, "unknown model preset 'gpt5'");
  expect_refused("train --d-model 100 --n-head 3" + d, 2,
                 "--d-model 100 is not divisible by --n-head 3");
  expect_refused("train --data /nonexistent.bin --steps 1", 2,
                 "cannot open data file '/nonexistent.bin'");
  expect_refused("train --vocab 100" + d, 2, ">= the model's vocab 100");
  // The suggested --vocab is the file's largest token + 1, so that it is the last retry.
  const train::TokenFile all(*data_, 65536);
  std::vector<int32_t> tokens(static_cast<size_t>(all.num_tokens()));
  all.read(0, all.num_tokens(), tokens.data());
  const int largest = *std::max_element(tokens.begin(), tokens.end());
  expect_refused("train --vocab 100" + d, 2,
                 fmt::format("the largest token in the file is {}: use --vocab {} or more", largest,
                             largest + 1));
  expect_refused("train --vocab " + std::to_string(largest) + d, 2,
                 fmt::format("use --vocab {} or more", largest + 1));
  expect_refused("train --batch 6 --microbatch 4" + d, 2,
                 "--microbatch 4 does not divide --batch 6");
  expect_refused("train --steps 0 --data " + *data_, 2, "--steps 0");
  expect_refused("train --no-such-flag", 2, "no-such-flag");
}

TEST_F(CliErrors, RefusesABadConfigFile) {
  const auto cfg = (*dir_ / "bad.json").string();
  std::ofstream(cfg) << R"({"n_layers": 3})";
  expect_refused("train --config " + cfg, 2, "unknown key 'n_layers'");
  std::ofstream(cfg) << R"({"n_layer": 3,)";
  expect_refused("train --config " + cfg, 2, "not valid JSON");
}

// (Non-finite steps are skipped, at most --skip-nonfinite in a row: tests/train/
// nonfinite_fault_test.cpp. Here the first is step 2 and the fourth in a row stops the run.)
TEST_F(CliErrors, NaNLossStopsTheRunWithExitCode1) {
  expect_refused(
      "train --seq 32 --batch 2 --steps 5 --lr 1e30 --warmup 0 --grad-clip 0 "
      "--peak-gflops 100 --data " +
          *data_,
      1, "was not finite for 4 step(s) in a row (steps 2-5)");
  expect_refused(
      "train --seq 32 --batch 2 --steps 5 --lr 1e30 --warmup 0 --grad-clip 0 --skip-nonfinite 0 "
      "--peak-gflops 100 --data " +
          *data_,
      1, "step 2: the loss");
  expect_refused("train --skip-nonfinite -1 --data " + *data_, 2,
                 "--skip-nonfinite -1 must be 0 (stop at the first non-finite step) or more");
}

TEST_F(CliErrors, EvalRefusesMissingOrDamagedWeightsAndLongSequences) {
  expect_refused("eval --weights /nonexistent.safetensors --data " + *data_, 2,
                 "cannot open weights file");
  const auto w = (*dir_ / "w.safetensors").string();
  auto r = test::run_meshtrain(
      "train --n-layer 1 --seq 32 --batch 2 --steps 1 --peak-gflops 100 "
      "--data " +
      *data_ + " --export " + w);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_refused("eval --weights " + w + " --seq 64 --data " + *data_, 2,
                 "sequence length 64 is longer than the model's seq_len 32");
  // The file records n_head (4, tiny's): --n-head may repeat it but not change it.
  expect_refused("eval --weights " + w + " --n-head 2 --seq 32 --data " + *data_, 2,
                 "--n-head 2 disagrees with n_head 4 recorded in weights file");
  r = test::run_meshtrain("eval --weights " + w + " --n-head 4 --seq 32 --data " + *data_);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::filesystem::resize_file(w, std::filesystem::file_size(w) / 2);
  expect_refused("eval --weights " + w + " --data " + *data_, 2, "truncated");
}

TEST_F(CliErrors, PrepareWritesAnLlmcFile) {
  const auto txt = (*dir_ / "a.txt").string(), out = (*dir_ / "a.bin").string();
  std::ofstream(txt) << "hello";
  auto r = test::run_meshtrain("prepare " + txt + " -o " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(std::filesystem::file_size(out), 1024u + 10u);
  expect_refused("prepare /nonexistent.txt -o " + out, 2, "cannot read text file");
}

// A refused prepare names the path and the fix (exit 2) and leaves no output, not even a
// temporary one; an input named as the output is not overwritten.
TEST_F(CliErrors, PrepareRefusesBadPathsAndWritesNothing) {
  namespace fs = std::filesystem;
  const fs::path txt = *dir_ / "s.txt", out = *dir_ / "p.bin";
  std::ofstream(txt) << "some text";
  auto nothing_written = [&](const fs::path& p) {
    EXPECT_FALSE(fs::exists(p)) << p;
    EXPECT_FALSE(fs::exists(p.string() + ".tmp")) << p;
  };
  expect_refused("prepare " + txt.string() + " -o " + txt.string(), 2,
                 "-o '" + txt.string() + "' is also an input");
  expect_refused("prepare " + txt.string() + " -o " + (*dir_ / "." / "s.txt").string(), 2,
                 "is also an input");
  std::ifstream in(txt);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "some text");
  EXPECT_FALSE(fs::exists(txt.string() + ".tmp"));
  expect_refused("prepare " + dir_->string() + " -o " + out.string(), 2,
                 "text file '" + dir_->string() + "' is a directory");
  nothing_written(out);
  expect_refused("prepare " + txt.string() + " /nonexistent.txt -o " + out.string(), 2,
                 "cannot read text file '/nonexistent.txt': No such file or directory");
  nothing_written(out);
  expect_refused("prepare " + txt.string() + " -o " + dir_->string(), 2,
                 "-o '" + dir_->string() + "' is a folder");
  nothing_written(*dir_ / "nowhere" / "p.bin");
  expect_refused("prepare " + txt.string() + " -o " + (*dir_ / "nowhere" / "p.bin").string(), 2,
                 "the folder '" + (*dir_ / "nowhere").string() + "' does not exist");
}

// --backend mpi runs one process per rank: started without mpirun it says so and how to
// start it, instead of "mpirun started 0 processes".
TEST_F(CliErrors, BackendMpiWithoutMpirunSaysToUseMpirun) {
  const std::string args = "train --backend mpi --steps 1 --peak-gflops 100 --data " + *data_;
  expect_refused(args, 2, "--backend mpi runs one process per rank and needs mpirun");
  expect_refused(args, 2, "needs mpirun: start the job with `mpirun -np 1 meshtrain ...`");
  expect_refused(args, 2, "or use --backend local");
}

// reshard writes only layouts a resume can run: the checkpoint's batch is fixed (a resume
// with another --batch is refused), so --dp must divide it; and what is not named (here the
// ZeRO stage) stays the checkpoint's.
TEST_F(CliErrors, ReshardRefusesALayoutTheBatchCannotRunAndKeepsTheZeroStage) {
  namespace fs = std::filesystem;
  const fs::path ck = *dir_ / "ckA", out = *dir_ / "rsd";
  const std::string run =
      "train --n-layer 2 --seq 32 --batch 8 --peak-gflops 100 --backend local --data " + *data_;
  auto r = test::run_meshtrain(run + " --steps 1 --dp 2 --zero 1 --checkpoint-dir " + ck.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string re = "reshard " + ck.string() + " --out " + out.string();
  expect_refused(re + " --dp 3", 2,
                 "--dp 3 does not divide the batch 8 that checkpoint '" +
                     (ck / "step-00000001").string() + "' was trained with");
  expect_refused(re + " --dp 3", 2, "choose a --dp among 1, 2, 4, 8");
  expect_refused(re + " --pp 2 --microbatches 3", 2,
                 "--microbatches 3 does not divide the 4 sequences per dp replica");
  EXPECT_FALSE(fs::exists(out / "step-00000001")) << "a refused reshard wrote a checkpoint";
  r = test::run_meshtrain(re + " --dp 4");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("dp 4 tp 1 pp 1 zero 1"), std::string::npos) << r.output;
  r = test::run_meshtrain("inspect --no-verify " + out.string());
  EXPECT_NE(r.output.find("layout dp 4 tp 1 pp 1 zero 1"), std::string::npos) << r.output;
  r = test::run_meshtrain(run + " --steps 2 --dp 4 --zero 1 --resume " + out.string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

}  // namespace
}  // namespace mt

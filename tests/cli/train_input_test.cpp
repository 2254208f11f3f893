// What `train` does with what a user gives it: numbers out of range, paths it could only
// fail to write at the end, config files, resumes and the metrics file across them. Each
// refusal is exit code 2, before any step, naming the value and the fix.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/train_flags.h"
#include "core/error.h"
#include "test_util.h"
#include "train/trainer.h"

namespace mt {
namespace {

class TrainInput : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(test::scratch_dir("train_input"));
    data_ = new std::string(test::demo_tokens(*dir_));
  }
  static std::filesystem::path* dir_;
  static std::string* data_;
  // A small run; `threads` and `peak` are flags of their own so that a test can give them.
  static std::string run(const std::string& extra, const std::string& threads = "1",
                         const std::string& peak = "100", const std::string& batch = "4") {
    return "train --model tiny --n-layer 2 --seq 32 --batch " + batch + " --threads " + threads +
           " --peak-gflops " + peak + " --data " + *data_ + " " + extra;
  }
  static std::string path(const std::string& name) { return (*dir_ / name).string(); }
  void expect_refused(const std::string& args, const std::string& says) {
    const test::RunResult r = test::run_meshtrain(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(says), std::string::npos) << args << "\n" << r.output;
    EXPECT_EQ(r.output.find("| loss "), std::string::npos) << "refused before any step: " << args;
  }
  // The "step" of each row of a metrics file, in order.
  static std::vector<int64_t> metric_steps(const std::string& file) {
    std::vector<int64_t> steps;
    std::ifstream in(file);
    std::string line;
    while (std::getline(in, line)) steps.push_back(nlohmann::json::parse(line).at("step"));
    return steps;
  }
};
std::filesystem::path* TrainInput::dir_ = nullptr;
std::string* TrainInput::data_ = nullptr;

// Every config key is also a flag (a merge once dropped --sites and --moe-balance from the
// flags while their config keys stayed).
TEST(TrainFlagsKeys, EveryConfigKeyIsAFlag) {
  CLI::App app;
  cli::TrainFlags flags;
  flags.add_to(app);
  const std::map<std::string, std::string> named_otherwise = {
      {"bias", "--no-bias"}, {"tied", "--untied"}, {"shuffle", "--no-shuffle"}};
  for (const std::string& key : cli::train_config_keys()) {
    std::string flag = "--" + key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    if (named_otherwise.count(key)) flag = named_otherwise.at(key);
    EXPECT_NE(app.get_option_no_throw(flag), nullptr) << "config key '" << key << "': no " << flag;
  }
}

TEST_F(TrainInput, RefusesNumbersOutOfRange) {
  expect_refused(run("--steps 3 --min-lr-ratio -1"), "--min-lr-ratio -1 must be in [0, 1]");
  expect_refused(run("--steps 3 --min-lr-ratio 2"), "--min-lr-ratio 2 must be in [0, 1]");
  expect_refused(run("--steps 3 --weight-decay -1"), "--weight-decay -1 must be");
  expect_refused(run("--steps 3 --grad-clip -1"), "--grad-clip -1 must be");
  expect_refused(run("--steps 3 --warmup -1"), "--warmup -1 must be 0 or more");
  expect_refused(run("--steps 3 --eval-every -3"), "--eval-every -3 must be");
  expect_refused(run("--steps 3 --eval-batches 0"), "--eval-batches 0 must be at least 1");
  expect_refused(run("--steps 3", "-2"), "--threads -2 must be");
  expect_refused(run("--steps 3 --comm-timeout 0"), "--comm-timeout 0 must be");
  expect_refused(run("--steps 3", "1", "0"), "--peak-gflops 0 must be");
}

TEST_F(TrainInput, RefusesFlagsThatWouldDoNothing) {
  expect_refused(run("--steps 3 --trace " + path("t.json")), "needs --pp 2 or more");
  expect_refused(run("--steps 3 --virtual-stages 2"), "--virtual-stages 2 needs a pipeline");
  expect_refused(run("--steps 3 --microbatch 2 --microbatches 4"),
                 "--microbatch 2 and --microbatches 4 disagree");
}

// A path that cannot be written is found before the run, not after it has trained.
TEST_F(TrainInput, RefusesOutputPathsItCouldNotWrite) {
  const std::string file = path("a_file");
  std::ofstream(file) << "x";
  expect_refused(run("--steps 3 --checkpoint-dir " + file),
                 "--checkpoint-dir '" + file + "' exists and is not a folder");
  expect_refused(run("--steps 3 --export " + path("no_dir/w.safetensors")),
                 "the folder '" + path("no_dir") + "' does not exist");
  // A folder is an export folder (model.safetensors + config.json) only when it is new,
  // empty or a previous export: this one holds the data.
  expect_refused(run("--steps 3 --export " + dir_->string()), "is a folder that holds other files");
  expect_refused(run("--steps 3 --pp 2 --trace " + path("no_dir/t.json")),
                 "--trace '" + path("no_dir/t.json") + "'");
  expect_refused(run("--steps 3 --metrics " + path("no_dir/m.jsonl")), "does not exist");
}

// mpirun's processes each running a whole job of rank threads would race on every file.
// (mpirun's environment without mpirun: the refusal comes before MPI is asked anything.)
TEST_F(TrainInput, RefusesTheLocalBackendUnderMpirunWithSeveralRanks) {
  const test::RunResult r = test::run_command("OMPI_COMM_WORLD_SIZE=2 " + std::string(MT_BINARY) +
                                              " " + run("--steps 3 --dp 2 --backend local"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--backend local under mpirun: each of the 2 processes"),
            std::string::npos)
      << r.output;
  // A job of one rank too: two processes would still write the same files.
  const test::RunResult one = test::run_command("OMPI_COMM_WORLD_SIZE=2 " + std::string(MT_BINARY) +
                                                " " + run("--steps 3 --backend local"));
  EXPECT_EQ(one.exit_code, 2) << one.output;
}

TEST_F(TrainInput, ConfigTakesEveryRunFieldAndRefusesWrongTypesByKey) {
  const std::string cfg = path("pipe.json"), metrics = path("cfg.jsonl");
  std::ofstream(cfg) << R"({"pp": 2, "microbatches": 2, "schedule": "gpipe", "steps": 2,
                           "metrics": ")"
                     << metrics << R"("})";
  const test::RunResult r = test::run_meshtrain(run("--config " + cfg));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("pp 2 (gpipe schedule"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("2 microbatch(es) of 2"), std::string::npos) << r.output;
  EXPECT_EQ(metric_steps(metrics), (std::vector<int64_t>{1, 2}));

  std::ofstream(cfg) << R"({"batch": 8.7})";
  expect_refused(run("--config " + cfg), "config key 'batch' must be an integer, not 8.7");
  std::ofstream(cfg) << R"({"lr": "3e-4"})";
  expect_refused(run("--config " + cfg), "config key 'lr' must be a number");
  std::ofstream(cfg) << R"({"checkpoint_every": -1, "checkpoint_dir": ")" << path("ck_cfg")
                     << R"("})";
  expect_refused(run("--config " + cfg), "--checkpoint-every -1");
  // --stop-after: a step before the last, with somewhere to save it.
  expect_refused(run("--steps 3 --stop-after 3 --checkpoint-dir " + path("ck_stop")),
                 "--stop-after 3 must be a step before the last (1 to 2;");
  expect_refused(run("--steps 3 --stop-after 2"), "--stop-after 2 needs --checkpoint-dir DIR");
}

// With --pp 1, --microbatches N is gradient accumulation: the same run as --microbatch
// batch / N, bitwise.
TEST_F(TrainInput, MicrobatchesWithoutAPipelineAccumulateGradients) {
  const test::RunResult a = test::run_meshtrain(run("--steps 3 --microbatches 2"));
  const test::RunResult b = test::run_meshtrain(run("--steps 3 --microbatch 2"));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(a.output.find("2 microbatch(es) of 2"), std::string::npos) << a.output;
  auto losses = [](const std::string& out) {
    std::string kept;
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);)
      if (line.rfind("step ", 0) == 0) kept += line.substr(0, line.find("| lr")) + "\n";
    return kept;
  };
  EXPECT_FALSE(losses(a.output).empty());
  EXPECT_EQ(losses(a.output), losses(b.output));
}

// The same command line serves the first start and every restart: the metrics file keeps
// the steps up to the checkpoint and goes on from there, once each.
TEST_F(TrainInput, ResumeContinuesTheMetricsFileAndRefusesACheckpointPastSteps) {
  const std::string ck = path("ck_metrics"), metrics = path("resume.jsonl");
  std::filesystem::remove_all(ck);
  const std::string base =
      run("--checkpoint-dir " + ck + " --checkpoint-every 2 --metrics " + metrics);
  test::RunResult r = test::run_meshtrain(base + " --resume auto --steps 5");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(metric_steps(metrics), (std::vector<int64_t>{1, 2, 3, 4, 5}));
  // Resume from step 4 (as after a crash in step 5): its row is written again, once.
  r = test::run_meshtrain(base + " --steps 7 --resume " + ck + "/step-00000004");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(metric_steps(metrics), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7}));
  // A finished run started again trains nothing and leaves the file as it was.
  r = test::run_meshtrain(base + " --resume auto --steps 7");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("nothing left to train"), std::string::npos) << r.output;
  EXPECT_EQ(metric_steps(metrics), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7}));
  expect_refused(base + " --resume auto --steps 3", "is at step 7, past --steps 3");
}

// A code review's findings (2026-11-24), each a command that went wrong.
TEST_F(TrainInput, StdoutMetricsOnResumeFlagRangesAndReshardWithoutMicrobatches) {
  // A resumed run's metrics on stdout: appended to, not read back (that waited forever).
  const std::string ck = path("ck_stdout");
  std::filesystem::remove_all(ck);
  ASSERT_EQ(test::run_meshtrain(run("--steps 2 --checkpoint-dir " + ck)).exit_code, 0);
  const test::RunResult out = test::run_command(
      "timeout 60 " + std::string(MT_BINARY) + " " +
      run("--steps 3 --checkpoint-dir " + ck + " --resume auto --metrics /dev/stdout"));
  EXPECT_EQ(out.exit_code, 0) << out.output;
  EXPECT_NE(out.output.find("{\"comm_bytes\""), std::string::npos) << out.output;
  // The suggested fix is one train accepts: a microbatch that does not divide is named.
  expect_refused(run("--steps 3 --pp 2 --microbatch 3", "1", "100", "8"),
                 "--microbatch 3 does not divide --batch 8");
  // A flag's error does not blame the config file; a flag out of its field's range is refused.
  const std::string cfg = path("plain.json");
  std::ofstream(cfg) << R"({"steps": 2})";
  const test::RunResult w = test::run_meshtrain(run("--config " + cfg + " --warmup -2"));
  EXPECT_EQ(w.exit_code, 2) << w.output;
  EXPECT_EQ(w.output.find("(config file"), std::string::npos) << w.output;
  expect_refused(run("--steps 3 --seed -1"), "--seed -1 is out of range");
  // reshard without --microbatches: the count is the resumed run's choice (3 of 3 sequences).
  const std::string ck3 = path("ck_mb3"), out3 = path("ck_mb3_out");
  const test::RunResult t3 = test::run_meshtrain(
      run("--steps 1 --pp 2 --microbatches 3 --checkpoint-dir " + ck3, "1", "100", "3"));
  ASSERT_EQ(t3.exit_code, 0) << t3.output;
  const test::RunResult rs = test::run_meshtrain("reshard " + ck3 + " --out " + out3);
  EXPECT_EQ(rs.exit_code, 0) << rs.output;
}

// A step's bytes are its own: the validation after step 2 (pipeline activations) is not
// counted in step 3's pp_bytes, so every step of the pipeline moves the same bytes.
TEST_F(TrainInput, ValidationTrafficIsNotTheNextStepsBytes) {
  const std::string metrics = path("eval_bytes.jsonl");
  const test::RunResult r =
      test::run_meshtrain(run("--steps 4 --pp 2 --eval-every 2 --metrics " + metrics));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(metrics);
  std::vector<double> pp;
  for (std::string line; std::getline(in, line);)
    pp.push_back(nlohmann::json::parse(line).at("pp_bytes").get<double>());
  ASSERT_EQ(pp.size(), 4u);
  EXPECT_GT(pp[0], 0);
  for (double b : pp) EXPECT_EQ(b, pp[0]);
}

TEST_F(TrainInput, WarnsWhenTheDataIsSmallerThanTheBatch) {
  const std::string small = path("small.bin");
  train::write_token_file(small, std::vector<uint16_t>(100, 7));  // 3 sequences of 32
  const test::RunResult r = test::run_meshtrain(
      "train --model tiny --n-layer 2 --seq 32 --batch 4 --threads 1 --peak-gflops 100 "
      "--steps 1 --data " +
      small);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("fewer than --batch 4: every step repeats sequences"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("fewer than --batch 4: each validation batch repeats them"),
            std::string::npos)
      << r.output;
}

// ---- a config file from elsewhere (tests/fuzz/config_file_fuzz.cpp, docs/fuzzing.md) -----

// The refusal of `--config FILE` with FILE holding `text`, as train reads it (the run
// options' checks included); "no error" if none.
std::string config_refusal(const std::string& text) {
  const std::string path = (test::scratch_dir("config_file") / "c.json").string();
  std::ofstream(path) << text;
  cli::TrainFlags flags;
  flags.config = path;
  try {
    train::TrainOptions o;
    flags.apply_to(o, flags.config_json(cli::train_command_config_keys()));
    o.validate();
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2) << e.what();
    return e.what();
  }
  return "no error";
}

// Found by reading: a value nested a million levels deep (a 2 MB file) overflowed the stack
// when the refusal printed it ("config key 'steps' must be an integer, not [[[...").
TEST(ConfigFile, DeepNestingIsRefusedNotAStackOverflow) {
  const int depth = 1'000'000;
  const std::string m =
      config_refusal(R"({"steps": )" + std::string(depth, '[') + std::string(depth, ']') + "}");
  EXPECT_NE(m.find("is not valid JSON: JSON nested more than 64 levels"), std::string::npos) << m;
}

// Found by reading: the refusals of a shape listed the valid values by a scan up to the
// value given: d_model 10^14 + 1 with 2 heads (GptConfig::validate) and --tp 7 of 10^12
// heads (check_tp) hung instead of answering; so did n_kv_head 7 of 10^12 heads
// (GptConfig::validate, found writing the hf_llama fuzz harness: a Llama config.json).
TEST(ConfigFile, HugeShapesAreRefusedAtOnce) {
  std::string m = config_refusal(R"({"d_model": 100000000000001, "n_head": 2})");
  EXPECT_NE(m.find("--d-model 100000000000001 is not divisible by --n-head 2 (choose n_head among "
                   "1, 29)"),
            std::string::npos)
      << m;
  m = config_refusal(R"({"n_head": 1000000000000, "d_model": 1000000000000, "tp": 7})");
  EXPECT_NE(m.find("--tp 7 does not divide n_head=1000000000000"), std::string::npos) << m;
  EXPECT_NE(m.find(", ...)"), std::string::npos) << m;
  m = config_refusal(R"({"n_head": 1000000000000, "d_model": 1000000000000, "n_kv_head": 7})");
  EXPECT_NE(m.find("--n-kv-head 7 does not divide --n-head 1000000000000"), std::string::npos) << m;
  EXPECT_NE(m.find(", ...)"), std::string::npos) << m;
}

}  // namespace
}  // namespace mt

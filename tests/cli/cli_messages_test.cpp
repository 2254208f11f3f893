// What `meshtrain` says to a user (issue 32, items 8 and 9): a mistyped command is named with
// the nearest one, --version, a folder given as data, a checkpoint given to eval, a model's
// label, the planner's units for a small model, which rank --profile is; flags that would do
// nothing or less than asked (--schedule interleaved with one chunk, --warmup past --steps,
// --threads 0); a resume that changes --lr, --seed or --data says so; the data formats and
// lists from the command line; dp taken from mpirun's process count, and an error in the
// command line printed once, not once per process.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/model_flags.h"
#include "test_util.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

class CliMessages : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(test::scratch_dir("cli_messages"));
    data_ = new std::string(test::demo_tokens(*dir_));
  }
  static fs::path* dir_;
  static std::string* data_;
  static std::string path(const std::string& name) { return (*dir_ / name).string(); }
  // A small run of `tiny` on `data` (default: the demo text), 2 layers unless `layers`, 1
  // thread unless `threads` ("": not given).
  static std::string run(const std::string& extra, const std::string& data = "", int layers = 2,
                         const std::string& threads = "1") {
    return "train --model tiny --n-layer " + std::to_string(layers) +
           " --seq 32 --batch 4 --peak-gflops 100 --data " + (data.empty() ? *data_ : data) +
           (threads.empty() ? "" : " --threads " + threads) + " " + extra;
  }
  static test::RunResult expect_refused(const std::string& args, const std::string& says) {
    const test::RunResult r = test::run_meshtrain(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(says), std::string::npos) << args << "\n" << r.output;
    EXPECT_EQ(r.output.find("| loss "), std::string::npos) << "refused before any step: " << args;
    return r;
  }
  static test::RunResult expect_ok(const std::string& args) {
    const test::RunResult r = test::run_meshtrain(args);
    EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.output;
    return r;
  }
};
fs::path* CliMessages::dir_ = nullptr;
std::string* CliMessages::data_ = nullptr;

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST_F(CliMessages, ATypoNamesTheNearestCommand) {
  expect_refused("trian --model tiny", "'trian' is not a meshtrain command: did you mean 'train'?");
  expect_refused("bench gem", "'gem' is not a meshtrain bench command: did you mean 'gemm'?");
  // Far from every command: named with the list, no guess.
  const test::RunResult r = expect_refused("frobnicate", "'frobnicate' is not a meshtrain command");
  EXPECT_EQ(r.output.find("did you mean"), std::string::npos) << r.output;
}

TEST_F(CliMessages, VersionPrintsTheVersionAndTheCommit) {
  const test::RunResult r = expect_ok("--version");
  EXPECT_NE(r.output.find("meshtrain 0.1.0 (commit "), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("(commit )"), std::string::npos) << "an empty commit: " << r.output;
}

TEST_F(CliMessages, AFolderAsDataAndACheckpointAsWeightsAreNamed) {
  expect_refused(run("--steps 1", dir_->string()), "is a folder, not a token file");
  const std::string ck = path("ck_eval");
  fs::remove_all(ck);
  expect_ok(run("--steps 1 --checkpoint-dir " + ck));
  for (const std::string& w : {ck, ck + "/step-00000001"})
    expect_refused("eval --weights " + w + " --data " + *data_,
                   "is a meshtrain checkpoint, not Hugging Face weights: write its weights with "
                   "`meshtrain export");
}

TEST_F(CliMessages, AModelIsLabelledByItsShape) {
  model::GptConfig c = model::preset("tiny");  // what train starts from without --model
  c.n_layer = 12, c.n_head = 12, c.d_model = 768, c.d_ff = 3072, c.vocab = 50304, c.seq_len = 256;
  EXPECT_EQ(cli::name_of_shape(c, ""), "gpt2-124m-shaped (vocab 50304, seq 256)");
  c.vocab = 50257, c.seq_len = 1024;
  EXPECT_EQ(cli::name_of_shape(c, ""), "gpt2-124m");
  c.d_model = 640;
  EXPECT_EQ(cli::name_of_shape(c, ""), "custom");
  EXPECT_EQ(cli::name_of_shape(c, "gpt2-124m"), "gpt2-124m (modified)");
  const test::RunResult r = expect_ok(run("--steps 1"));
  EXPECT_NE(r.output.find("model tiny (modified) (2 layers"), std::string::npos) << r.output;
}

TEST_F(CliMessages, PlanShowsASmallModelsMemoryInItsUnitAndProfileNamesItsRank) {
  const test::RunResult p = expect_ok("plan --model tiny --cluster dgx-a100 --gpus 1");
  EXPECT_NE(p.output.find("(MB per GPU"), std::string::npos) << p.output;
  EXPECT_EQ(p.output.find("  0.00   0.00"), std::string::npos) << p.output;
  const test::RunResult s = expect_ok("simulate --model tiny --cluster dgx-a100 --gpus 1");
  EXPECT_EQ(s.output.find("0.000 GB"), std::string::npos) << s.output;
  const test::RunResult t = expect_ok(run("--steps 1 --dp 2 --profile"));
  EXPECT_NE(t.output.find("profile of rank 0 (pp 0 dp 0 tp 0"), std::string::npos) << t.output;
  EXPECT_NE(t.output.find("over 1 training step(s) (time"), std::string::npos) << t.output;
  // Over more steps the first (page faults, primitive creation) is left out, and the
  // validation's forwards are not counted: one optimizer call per step counted.
  const test::RunResult u = expect_ok(run("--steps 3 --profile"));
  EXPECT_NE(u.output.find("over 2 training step(s), the first left out"), std::string::npos)
      << u.output;
  auto calls = [&](const std::string& kernel) {
    const size_t at = u.output.find("  " + kernel + " ");
    if (at == std::string::npos) return std::string("(no row)");
    return u.output.substr(at, u.output.find('\n', at) - at);
  };
  EXPECT_NE(calls("optimizer").find(" 2 calls"), std::string::npos) << calls("optimizer");
  // 2 blocks x 2 steps; the last step's validation forwards would add to the forward only.
  EXPECT_NE(calls("gelu.fwd").find(" 4 calls"), std::string::npos) << calls("gelu.fwd");
  EXPECT_NE(calls("gelu.bwd").find(" 4 calls"), std::string::npos) << calls("gelu.bwd");
}

TEST_F(CliMessages, FlagsThatWouldDoLessThanAskedAreRefused) {
  expect_refused(run("--steps 2 --pp 2 --microbatches 4 --schedule interleaved"),
                 "--schedule interleaved needs --virtual-stages 2 or more");
  expect_refused(run("--steps 2 --schedule interleaved"),
                 "--schedule interleaved needs --virtual-stages 2 or more");
  expect_refused(run("--steps 2 --warmup 1000"),
                 "--warmup 1000 is longer than --steps 2: the learning rate would never reach");
  expect_refused(run("--steps 2", "", 2, "0"), "--threads 0: a rank needs at least 1 thread");
  const std::string cfg = path("threads0.json");
  std::ofstream(cfg) << R"({"threads": 0})";
  expect_refused(run("--steps 2 --config " + cfg, "", 2, ""), "--threads 0");
  expect_refused(run("--steps 2 --shuffle --no-shuffle"), "contradict each other");
  // What is allowed stays so: warmup equal to the steps, interleaving with 2 chunks.
  expect_ok(run("--steps 2 --warmup 2"));
  expect_ok(
      run("--steps 1 --pp 2 --microbatches 2 --schedule interleaved --virtual-stages 2", "", 4));
}

TEST_F(CliMessages, AResumeSaysWhatChanged) {
  const std::string ck = path("ck_changes");
  fs::remove_all(ck);
  expect_ok(run("--steps 2 --checkpoint-dir " + ck));
  const std::string resume = "--steps 3 --resume " + ck + "/step-00000002";
  const std::string again = run(resume);
  // The same command line: nothing to say.
  const test::RunResult same = expect_ok(again);
  EXPECT_EQ(same.output.find("resume: "), std::string::npos) << same.output;
  const std::string copy = path("demo_copy.bin");
  fs::copy_file(*data_, copy, fs::copy_options::overwrite_existing);
  const test::RunResult r = expect_ok(run(resume + " --lr 5e-4 --seed 7", copy));
  EXPECT_NE(r.output.find("resume: --lr 0.0005 differs from the checkpoint's 0.001"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("resume: --seed 7 differs from the checkpoint's 1337"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("resume: --data '" + copy + "' differs from the checkpoint's"),
            std::string::npos)
      << r.output;
  const test::RunResult order = expect_ok(again + " --no-shuffle");
  EXPECT_NE(order.output.find("resume: --no-shuffle: the checkpoint's run read its samples "
                              "shuffled, this one reads them in file order from step 3 on"),
            std::string::npos)
      << order.output;
}

TEST_F(CliMessages, DataListsGlobsAndFormatsFromTheCommandLine) {
  // nanoGPT's train.bin: the demo text's tokens as bare uint16.
  const train::TokenFile demo(*data_, 256);
  std::vector<int32_t> t(static_cast<size_t>(demo.num_tokens()));
  demo.read(0, demo.num_tokens(), t.data());
  const std::vector<uint16_t> raw(t.begin(), t.end());
  {
    std::ofstream out(path("train.bin"), std::ios::binary);
    out.write(reinterpret_cast<const char*>(raw.data()),
              static_cast<std::streamsize>(2 * raw.size()));
  }
  expect_refused(run("--steps 1", path("train.bin")), "--data-format nanogpt");
  // The same tokens as nanoGPT data train exactly as the llm.c file does (in file order and
  // shuffled alike).
  const std::string m1 = path("llmc.jsonl"), m2 = path("nano.jsonl");
  expect_ok(run("--steps 2 --metrics " + m1));
  expect_ok(run("--steps 2 --data-format nanogpt --metrics " + m2, path("train.bin")));
  auto losses = [](const std::string& f) {
    std::vector<float> out;
    std::ifstream in(f);
    for (std::string line; std::getline(in, line);)
      out.push_back(nlohmann::json::parse(line).at("loss").get<float>());
    return out;
  };
  EXPECT_EQ(losses(m1), losses(m2));
  // A list and a glob (two copies of the demo text) are read as one corpus.
  fs::copy_file(*data_, path("part_a.bin"), fs::copy_options::overwrite_existing);
  fs::copy_file(*data_, path("part_b.bin"), fs::copy_options::overwrite_existing);
  const test::RunResult g = expect_ok(run("--steps 1", "'" + path("part_*.bin") + "'"));
  EXPECT_NE(g.output.find("2 files (llm.c), " + std::to_string(2 * t.size()) + " tokens"),
            std::string::npos)
      << g.output;
  const test::RunResult l =
      expect_ok(run("--steps 1", path("part_a.bin") + "," + path("part_b.bin")));
  EXPECT_NE(l.output.find("2 files (llm.c)"), std::string::npos) << l.output;
  expect_refused(run("--steps 1 --data-format hf"), "--data-format 'hf' is not a data format");
}

// mpirun: dp is the processes / (tp x pp); a layout that does not divide is refused once.
TEST_F(CliMessages, MpirunInfersDpAndPrintsAnErrorOnce) {
  ASSERT_EQ(test::run_command("command -v mpirun").exit_code, 0) << "no mpirun: scripts/setup.sh";
  const test::RunResult r = test::run_mpirun(2, run("--steps 2"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("dp 2 (ZeRO-0, mpi backend)"), std::string::npos) << r.output;
  const test::RunResult bad = test::run_mpirun(3, run("--steps 2 --tp 2"));
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("mpirun started 3 processes, which --tp 2 x --pp 1 = 2 does not "
                            "divide"),
            std::string::npos)
      << bad.output;
  EXPECT_EQ(count(bad.output, "error: "), 1u) << bad.output;
  // An error of the command line itself, once too.
  const test::RunResult flag = test::run_mpirun(2, run("--steps 2 --no-such-flag"));
  EXPECT_EQ(count(flag.output, "no-such-flag"), 1u) << flag.output;
}

}  // namespace
}  // namespace mt

// `meshtrain reshard` never writes into its source (docs/checkpoints.md): --out equal to the
// checkpoint, to the directory holding it or inside either is refused before anything is
// read (exit 2); a non-empty --out needs --force; `latest` there never moves back to an
// older step; --cp rewrites it for context parallelism.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "test_util.h"
#include "train/checkpoint.h"

namespace mt::test {
namespace {

namespace fs = std::filesystem;
namespace ckpt = train::ckpt;

class ReshardCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(scratch_dir("reshard-cli"));
    const std::string data = demo_tokens(*dir_);
    // Checkpoints of steps 2 and 4 of one run.
    const RunResult r = run_meshtrain("train --model tiny --n-layer 2 --data " + data +
                                      " --steps 4 --batch 8 --threads 1 --peak-gflops 100 "
                                      "--checkpoint-dir " +
                                      (*dir_ / "src").string() + " --checkpoint-every 2");
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static fs::path src() { return *dir_ / "src"; }
  static std::string latest(const fs::path& d) {
    std::ifstream in(d / "latest");
    std::string s;
    std::getline(in, s);
    return s;
  }
  // The source is untouched: both checkpoints verify, `latest` names step 4.
  static void expect_source_intact() {
    EXPECT_EQ(ckpt::list_checkpoints(src().string()).size(), 2u);
    for (const std::string& k : ckpt::list_checkpoints(src().string())) {
      const ckpt::Index idx = ckpt::read_index(k);
      EXPECT_EQ(idx.dp, 1) << k;
      EXPECT_TRUE(ckpt::verify(idx).empty()) << k;
    }
    EXPECT_EQ(latest(src()), "step-00000004");
  }
  static fs::path* dir_;
};
fs::path* ReshardCli::dir_ = nullptr;

TEST_F(ReshardCli, IntoItsSourceIsRefused) {
  const std::string s = src().string();
  struct Case {
    std::string checkpoint, out, says;
  };
  const std::vector<Case> cases = {
      // The command: the directory holding the checkpoints, as its own --out.
      {s, s, "reshard --out '" + s + "' is the source '" + s + "'"},
      {s, s + "/", "is the source"},
      {s, s + "/../src", "is the source"},
      {s, s + "/inner", "is inside the source"},
      {s + "/step-00000002", s + "/step-00000002", "is the source"},
      // Writing step-2 into the folder that holds it would replace it.
      {s + "/step-00000002", s, "holds the source checkpoint"},
  };
  for (const Case& c : cases) {
    const RunResult r = run_meshtrain("reshard " + c.checkpoint + " --out " + c.out + " --dp 2");
    EXPECT_EQ(r.exit_code, 2) << c.out << "\n" << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << c.out << "\n" << r.output;
    EXPECT_EQ(r.output.find(") into "), std::string::npos) << r.output;  // no success line
  }
  EXPECT_FALSE(fs::exists(src() / "inner"));
  expect_source_intact();
}

TEST_F(ReshardCli, NonEmptyOutNeedsForceAndLatestNeverMovesBack) {
  const fs::path out = *dir_ / "out";
  fs::remove_all(out);
  // Step 4 first (the newest), then step 2 with --force into the same folder.
  ASSERT_EQ(
      run_meshtrain("reshard " + src().string() + " --out " + out.string() + " --dp 2").exit_code,
      0);
  EXPECT_EQ(latest(out), "step-00000004");
  const std::string older =
      "reshard " + (src() / "step-00000002").string() + " --out " + out.string() + " --dp 2";
  const RunResult refused = run_meshtrain(older);
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("reshard --out '" + out.string() + "' is not empty"),
            std::string::npos)
      << refused.output;
  EXPECT_NE(refused.output.find("--force"), std::string::npos) << refused.output;
  EXPECT_FALSE(fs::exists(out / "step-00000002"));

  const RunResult forced = run_meshtrain(older + " --force");
  ASSERT_EQ(forced.exit_code, 0) << forced.output;
  EXPECT_TRUE(ckpt::verify(ckpt::read_index((out / "step-00000002").string())).empty());
  EXPECT_EQ(ckpt::read_index((out / "step-00000002").string()).dp, 2);
  EXPECT_EQ(latest(out), "step-00000004");  // not moved back to step 2
  expect_source_intact();
}

// --cp: the checkpoint rewritten for cp 2 x ZeRO-1 (a shard per rank of the dp x cp group),
// which `train --cp 2 --resume` continues; a cp that does not split the sequence is refused
// before anything is written.
TEST_F(ReshardCli, ToAnotherCpAndResumed) {
  const fs::path out = *dir_ / "out_cp";
  fs::remove_all(out);
  const RunResult r =
      run_meshtrain("reshard " + src().string() + " --out " + out.string() + " --cp 2 --zero 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("as dp 1 cp 2 tp 1 pp 1 zero 1: 2 files"), std::string::npos) << r.output;
  const ckpt::Index idx = ckpt::read_index((out / "step-00000004").string());
  EXPECT_EQ(idx.cp, 2);
  EXPECT_TRUE(ckpt::verify(idx).empty());
  const RunResult resumed =
      run_meshtrain("train --model tiny --n-layer 2 --data " + demo_tokens(*dir_) +
                    " --steps 6 --batch 8 --threads 1 --peak-gflops 100 --cp 2 --zero 1 --resume " +
                    (out / "step-00000004").string());
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from checkpoint"), std::string::npos) << resumed.output;
  const RunResult odd = run_meshtrain("reshard " + src().string() + " --out " +
                                      (*dir_ / "out_cp3").string() + " --cp 5");
  EXPECT_EQ(odd.exit_code, 2) << odd.output;
  EXPECT_NE(odd.output.find("--cp 5"), std::string::npos) << odd.output;
  EXPECT_FALSE(fs::exists(*dir_ / "out_cp3" / "step-00000004"));
  expect_source_intact();
}

}  // namespace
}  // namespace mt::test

// The NaN/Inf guard (train/nonfinite.h, docs/checkpoints.md "Non-finite steps"): a run whose
// loss or gradient norm goes non-finite skips those updates (at most --skip-nonfinite in a
// row), then stops with exit 1 naming the step; no checkpoint and no export ever holds a
// non-finite value; a restart does not resume into the same failure. Every layout and the
// mpi backend decide together (one all-reduce), so none hangs and all stop at one step.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "train/checkpoint.h"
#include "train/nonfinite.h"

namespace mt::test {
namespace {

namespace fs = std::filesystem;
namespace ckpt = train::ckpt;

const fs::path& dir() {
  static const fs::path d = scratch_dir("nonfinite");
  return d;
}

const std::string& data() {
  static const std::string p = demo_tokens(dir());
  return p;
}

// --lr 1e4 on a 2-layer tiny model (the reproduction, smaller): the first updates
// blow the weights up, and from step 4 on the gradient norm is NaN.
std::string nan_run(const fs::path& ckpt_dir, const std::string& extra = "",
                    const std::string& lr = "1e4") {
  return "train --model tiny --n-layer 2 --data " + data() + " --lr " + lr +
         " --steps 12 --batch 8 --threads 1 --peak-gflops 100 --checkpoint-dir " +
         ckpt_dir.string() + " --checkpoint-every 1 " + extra;
}

std::vector<nlohmann::json> rows(const fs::path& metrics) {
  std::vector<nlohmann::json> out;
  std::ifstream in(metrics);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

// Every value of every checkpoint in `c` (master weights, AdamW's m and v) is finite.
void expect_all_checkpoints_finite(const fs::path& c) {
  const std::vector<std::string> all = ckpt::list_checkpoints(c.string());
  ASSERT_FALSE(all.empty()) << c;
  for (const std::string& k : all) {
    const ckpt::GlobalState st = ckpt::load_global(ckpt::read_index(k));
    for (int a = 0; a < ckpt::kArrays; ++a)
      for (size_t i = 0; i < st.specs.size(); ++i)
        EXPECT_EQ(train::first_nonfinite(st.arrays[a][i].data(),
                                         static_cast<int64_t>(st.arrays[a][i].size())),
                  -1)
            << k << ": " << ckpt::kArrayNames[a] << " of " << st.specs[i].name;
  }
}

TEST(NonFinite, FirstNonfiniteFindsNanAndInfAnywhere) {
  std::vector<float> v(5000, 1.5f);
  EXPECT_EQ(train::first_nonfinite(v.data(), 5000), -1);
  v[4321] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(train::first_nonfinite(v.data(), 5000), 4321);
  v[1030] = -std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(train::first_nonfinite(v.data(), 5000), 1030);
  // Huge finite values are finite (their block's sum of x * 0 is still 0).
  std::vector<float> big(3000, 3e38f);
  EXPECT_EQ(train::first_nonfinite(big.data(), 3000), -1);
  EXPECT_NE(train::describe_nonfinite("w", v.data(), 5000).find("2 non-finite value(s)"),
            std::string::npos);
}

TEST(NonFinite, GuardAllowsNInARowThenStops) {
  train::NonFiniteGuard g(2);
  EXPECT_FALSE(g.record(true));
  EXPECT_FALSE(g.record(true));
  EXPECT_FALSE(g.record(false));  // a finite step resets the count
  EXPECT_FALSE(g.record(true));
  EXPECT_FALSE(g.record(true));
  EXPECT_TRUE(g.record(true));  // the third in a row
  EXPECT_EQ(g.skipped_total(), 5);
  train::NonFiniteGuard none(0);
  EXPECT_TRUE(none.record(true));
}

// The command: the NaN steps are skipped and recorded, the run stops with exit 1
// naming the step, every checkpoint is finite, no export is written, and --max-restarts does
// not start again into the same failure.
TEST(NonFinite, NanRunStopsWithNoNonFiniteCheckpointOrExport) {
  const fs::path c = dir() / "local", m = dir() / "local.jsonl";
  const fs::path e = dir() / "local.safetensors";
  fs::remove_all(c);
  const RunResult r = run_meshtrain(nan_run(
      c, "--resume auto --max-restarts 2 --metrics " + m.string() + " --export " + e.string()));
  ASSERT_EQ(r.exit_code, 1) << r.output;
  // Steps 4, 5, 6 skipped (--skip-nonfinite 3 by default), step 7 stops the run.
  EXPECT_NE(r.output.find("step 7: the loss"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("not finite for 4 step(s) in a row (steps 4-7), more than "
                          "--skip-nonfinite 3"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("not restarting (--max-restarts)"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("restarting from the newest checkpoint"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(e));
  EXPECT_FALSE(fs::exists(e.string() + ".tmp"));
  const std::vector<nlohmann::json> rs = rows(m);
  ASSERT_EQ(rs.size(), 7u);
  for (size_t i = 0; i < 3; ++i) EXPECT_FALSE(rs[i].contains("skipped")) << rs[i];
  for (size_t i = 3; i < 7; ++i) {
    EXPECT_EQ(rs[i].value("skipped", false), true) << rs[i];
    EXPECT_TRUE(rs[i]["grad_norm"].is_null()) << rs[i];  // NaN is written as null
  }
  // Steps 1-6 saved (a skipped step's weights are the last finite ones), all finite.
  expect_all_checkpoints_finite(c);
  EXPECT_EQ(ckpt::list_checkpoints(c.string()).front(), (c / "step-00000006").string());
  EXPECT_NE(r.output.find("holds the finite weights of step 6"), std::string::npos) << r.output;

  // The same command again (what a supervisor does) is refused before any step: it names
  // the checkpoint it would resume and the step that failed; exit 2, so the supervisor stops.
  const RunResult again = run_meshtrain(nan_run(c, "--resume auto"));
  ASSERT_EQ(again.exit_code, 2) << again.output;
  EXPECT_NE(again.output.find("resuming from checkpoint '" + (c / "step-00000006").string() +
                              "' with these settings ended in non-finite steps at step 7"),
            std::string::npos)
      << again.output;
  EXPECT_EQ(again.output.find("step     7/"), std::string::npos) << again.output;
  // Changed settings are another run: allowed, said, and its first checkpoint clears the
  // record. (Here the weights are past saving: every step is skipped, which --skip-nonfinite
  // 20 allows to the end.)
  const RunResult lower = run_meshtrain(nan_run(c, "--resume auto --skip-nonfinite 20", "1e-5"));
  EXPECT_EQ(lower.exit_code, 0) << lower.output;
  EXPECT_NE(lower.output.find("with changed settings: lr, skip_nonfinite"), std::string::npos)
      << lower.output;
  EXPECT_FALSE(fs::exists(c / "nonfinite.json"));
  expect_all_checkpoints_finite(c);
}

// --skip-nonfinite 0: the first non-finite step stops the run; nothing of it is saved.
TEST(NonFinite, SkipZeroStopsAtTheFirst) {
  const fs::path c = dir() / "zero";
  fs::remove_all(c);
  const RunResult r = run_meshtrain(nan_run(c, "--skip-nonfinite 0"));
  ASSERT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("step 4: the loss"), std::string::npos) << r.output;
  EXPECT_EQ(ckpt::list_checkpoints(c.string()).front(), (c / "step-00000003").string());
  expect_all_checkpoints_finite(c);
}

// Every layout decides together: dp with ZeRO-3, tp with sp, pp (1F1B), dp x pp all stop
// with exit 1 after --skip-nonfinite + 1 non-finite steps (no rank left waiting in a
// collective), with only finite checkpoints. (The step can differ from the single rank's:
// each layout sums in its own order, and these values are around 1e15.)
class NonFiniteLayouts : public ::testing::TestWithParam<std::string> {};

TEST_P(NonFiniteLayouts, EveryRankStopsAtTheSameStep) {
  std::string name = GetParam();
  for (char& ch : name)
    if (ch == ' ' || ch == '-') ch = '_';
  const fs::path c = dir() / name;
  fs::remove_all(c);
  const RunResult r = run_meshtrain(nan_run(c, GetParam() + " --comm-timeout 60"));
  ASSERT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("was not finite for 4 step(s) in a row"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("watchdog"), std::string::npos) << r.output;
  expect_all_checkpoints_finite(c);
}

INSTANTIATE_TEST_SUITE_P(Layouts, NonFiniteLayouts,
                         ::testing::Values("--dp 2 --zero 3", "--tp 2 --sp", "--pp 2",
                                           "--dp 2 --zero 1 --pp 2 --microbatches 2"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::string out;
                           for (char ch : n)
                             if (std::isalnum(static_cast<unsigned char>(ch))) out += ch;
                           return out;
                         });

// Under mpirun (the Open MPI backend, one process per rank): the same decision on every
// process, exit 1 through MPI_Abort, only finite checkpoints.
TEST(NonFinite, MpirunEveryProcessStops) {
  ASSERT_EQ(run_command("command -v mpirun").exit_code, 0) << "no mpirun: run scripts/setup.sh";
  const fs::path c = dir() / "mpirun";
  fs::remove_all(c);
  const RunResult r = run_mpirun(2, nan_run(c, "--dp 2 --zero 2 --comm-timeout 60"));
  ASSERT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("mpi backend"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("was not finite for 4 step(s) in a row"), std::string::npos) << r.output;
  expect_all_checkpoints_finite(c);
}

// A checkpoint damaged into holding a NaN (its checksum made to match): export and reshard
// refuse it and write nothing; a run resumed from it skips its non-finite steps and refuses
// to save the NaN weights.
TEST(NonFinite, NanInACheckpointIsNeverExportedResavedOrResharded) {
  const fs::path c = dir() / "damaged";
  fs::remove_all(c);
  const std::string run = "train --model tiny --n-layer 2 --data " + data() +
                          " --batch 8 --threads 1 --peak-gflops 100 --checkpoint-dir " + c.string();
  ASSERT_EQ(run_meshtrain(run + " --steps 2").exit_code, 0);
  const fs::path step = c / "step-00000002";
  nlohmann::json index = nlohmann::json::parse(std::ifstream(step / "index.json"));
  nlohmann::json& piece = index["pieces"][0];
  const fs::path shard = step / index["files"][piece["file"].get<int>()]["name"].get<std::string>();
  const int64_t at = piece["offsets"][0].get<int64_t>();
  const int64_t n = piece["local"][1].get<int64_t>() - piece["local"][0].get<int64_t>();
  std::vector<float> master(static_cast<size_t>(n));
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(at);
    f.read(reinterpret_cast<char*>(master.data()), n * 4);
    master[static_cast<size_t>(n / 2)] = std::numeric_limits<float>::quiet_NaN();
    f.seekp(at);
    f.write(reinterpret_cast<const char*>(master.data()), n * 4);
  }
  piece["crc32c"][0] = ckpt::crc32c(master.data(), static_cast<size_t>(n) * 4);
  std::ofstream(step / "index.json") << index.dump(1);
  ASSERT_TRUE(ckpt::verify(ckpt::read_index(step.string())).empty());

  const fs::path e = dir() / "damaged.safetensors";
  const RunResult ex = run_meshtrain("export " + c.string() + " --out " + e.string());
  EXPECT_EQ(ex.exit_code, 1) << ex.output;
  EXPECT_NE(ex.output.find("not exporting to '" + e.string() + "'"), std::string::npos)
      << ex.output;
  EXPECT_NE(ex.output.find("non-finite value(s)"), std::string::npos) << ex.output;
  EXPECT_FALSE(fs::exists(e));
  EXPECT_FALSE(fs::exists(e.string() + ".tmp"));

  const fs::path re = dir() / "damaged_re";
  fs::remove_all(re);
  const RunResult rs = run_meshtrain("reshard " + c.string() + " --out " + re.string() + " --dp 2");
  EXPECT_EQ(rs.exit_code, 2) << rs.output;
  EXPECT_NE(rs.output.find("is not resharded"), std::string::npos) << rs.output;
  EXPECT_TRUE(ckpt::list_checkpoints(re.string()).empty());

  // Resumed: the NaN weight makes every step non-finite (skipped); the checkpoint of step 3
  // would hold the NaN: refused, nothing new on disk.
  const RunResult res = run_meshtrain(run + " --steps 4 --checkpoint-every 1 --resume auto");
  EXPECT_EQ(res.exit_code, 1) << res.output;
  EXPECT_NE(res.output.find("the checkpoint of step 3 is not written: master of"),
            std::string::npos)
      << res.output;
  EXPECT_EQ(ckpt::list_checkpoints(c.string()), std::vector<std::string>{step.string()});
  EXPECT_FALSE(fs::exists(c / "step-00000003.tmp"));
}

}  // namespace
}  // namespace mt::test

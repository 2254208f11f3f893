// Checkpoints with context parallelism (docs/context_parallel.md, docs/checkpoints.md): a
// cp rank saves the optimizer range it holds in its replica's dp x cp group, so a cp run
// resumes bitwise in its own layout, and continues within the layout tolerance when resumed
// (or resharded offline) at another cp, with or without ZeRO and dp.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "model/params.h"
#include "parallel3d_test_util.h"
#include "train/checkpoint.h"

namespace mt::test {
namespace {

namespace fs = std::filesystem;
using train::TrainOptions;
using train::TrainResult;
namespace ckpt = train::ckpt;

struct CpRun {
  Layout3d l;
  int cp = 1;
  std::string comm = "ring";
};

// (Built by a function: GCC 12 warns that designated initialisers of the nested Layout3d
// leave its string "maybe uninitialized".)
CpRun cp_run(int cp, const std::string& comm, int dp = 1, int tp = 1, int zero = 0,
             bool sp = false) {
  CpRun c;
  c.l.dp = dp;
  c.l.tp = tp;
  c.l.zero = zero;
  c.l.sp = sp;
  c.cp = cp;
  c.comm = comm;
  return c;
}

std::string name_of(const CpRun& c) {
  return "cp" + std::to_string(c.cp) + "_" + (c.comm == "all-gather" ? "allgather" : c.comm) + "_" +
         test::name_of(c.l);
}

// The 3D tests' Llama (rotary positions, grouped-query heads): seq 24 splits into 2 x cp
// chunks for cp 1, 2, 3, 4 and 6.
TrainOptions options(const CpRun& c, int64_t steps) {
  TrainOptions o = options3d(c.l, steps);
  make_llama3d(o.model);
  o.cp = c.cp;
  o.cp_comm = c.comm;
  o.keep_final_params = true;
  return o;
}

fs::path fresh(const std::string& name) {
  const fs::path d = dir3d() / name;
  fs::remove_all(d);
  return d;
}

// 8 steps with a checkpoint every 4 (and after the last).
TrainResult run_saving(const CpRun& c, const fs::path& dir) {
  TrainOptions o = options(c, 8);
  o.checkpoint_dir = dir.string();
  o.checkpoint_every = 4;
  return train::run_training(o);
}

TrainResult run_resumed(const CpRun& c, const fs::path& ckpt_dir) {
  TrainOptions o = options(c, 8);
  o.resume = ckpt_dir.string();
  return train::run_training(o);
}

// 5e-5: the layout tolerance of the loss (cp_equiv_test, parallel3d_equiv_test: a layout
// differs from another by f32 summation order only; measured ~1e-6 on this model). A run
// resumed at another cp sums in that cp's order from step 5 on.
constexpr double kLossTol = 5e-5;

// The same layout: the continued run's losses, gradient norms and final parameters are
// bitwise the uninterrupted run's.
class CpExactResume : public ::testing::TestWithParam<CpRun> {};

TEST_P(CpExactResume, BitwiseSameLossesAndWeights) {
  const CpRun c = GetParam();
  const fs::path dir = fresh("cp_exact_" + name_of(c));
  const TrainResult full = run_saving(c, dir);
  const ckpt::Index idx = ckpt::read_index((dir / "step-00000004").string());
  EXPECT_EQ(idx.cp, c.cp);
  EXPECT_EQ(idx.dp, c.l.dp);
  EXPECT_TRUE(ckpt::verify(idx).empty());
  const TrainResult cont = run_resumed(c, dir / "step-00000004");
  EXPECT_EQ(cont.start_step, 4);
  ASSERT_EQ(cont.steps.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(cont.steps[i].loss, full.steps[i + 4].loss) << "step " << i + 5;
    EXPECT_EQ(cont.steps[i].grad_norm, full.steps[i + 4].grad_norm) << "step " << i + 5;
  }
  ASSERT_EQ(cont.ranks.size(), full.ranks.size());
  for (size_t r = 0; r < full.ranks.size(); ++r)
    EXPECT_TRUE(cont.ranks[r].final_params == full.ranks[r].final_params) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Layouts, CpExactResume,
                         ::testing::Values(cp_run(2, "ring"), cp_run(2, "all-gather", 2, 1, 3),
                                           cp_run(2, "a2a", 1, 2, 1, true)),
                         [](const auto& info) { return name_of(info.param); });

// Saved at cp 2 x dp 2 with ZeRO-1 (every rank of the dp x cp group saves its quarter),
// resumed at cp 1 and cp 4 and in other dp x cp shardings.
class CpReshard : public ::testing::TestWithParam<CpRun> {};

const TrainResult& reshard_source() {
  static const TrainResult full = run_saving(cp_run(2, "ring", 2, 1, 1), fresh("cp_src"));
  return full;
}

TEST_P(CpReshard, ContinuesWithinTheLayoutTolerance) {
  const TrainResult& full = reshard_source();
  const TrainResult cont = run_resumed(GetParam(), dir3d() / "cp_src" / "step-00000004");
  EXPECT_EQ(cont.start_step, 4);
  ASSERT_EQ(cont.steps.size(), 4u);
  for (size_t i = 0; i < 4; ++i)
    EXPECT_NEAR(cont.steps[i].loss, full.steps[i + 4].loss, kLossTol) << "step " << i + 5;
}

INSTANTIATE_TEST_SUITE_P(Layouts, CpReshard,
                         ::testing::Values(cp_run(1, "ring"), cp_run(4, "ring"),
                                           cp_run(4, "a2a", 2, 1, 3), cp_run(1, "ring", 4, 1, 2),
                                           cp_run(4, "all-gather", 1, 2, 0)),
                         [](const auto& info) { return name_of(info.param); });

// Offline (`meshtrain reshard --cp`): cp 2 x dp 2 ZeRO-3 rewritten as cp 4 ZeRO-2, one shard
// per rank of the dp x cp group, continues like the original.
TEST(CpCheckpoint, OfflineReshardToAnotherCp) {
  const fs::path src = fresh("cp_offline_src"), out = fresh("cp_offline_out");
  const CpRun saved = cp_run(2, "ring", 2, 1, 3);
  const TrainResult full = run_saving(saved, src);
  const ckpt::Index idx = ckpt::read_index((src / "step-00000004").string());
  EXPECT_EQ(idx.layout_text, "dp 2 cp 2 tp 1 pp 1 zero 3");
  const CpRun target = cp_run(4, "ring", 1, 1, 2);
  EXPECT_EQ(ckpt::write_resharded(idx, ckpt::load_global(idx), options(target, 8), out.string()),
            4);
  const ckpt::Index re = ckpt::read_index((out / "step-00000004").string());
  EXPECT_TRUE(ckpt::verify(re).empty());
  EXPECT_EQ(re.cp, 4);
  EXPECT_EQ(re.zero, 2);
  const TrainResult cont = run_resumed(target, out / "step-00000004");
  ASSERT_EQ(cont.steps.size(), 4u);
  for (size_t i = 0; i < 4; ++i)
    EXPECT_NEAR(cont.steps[i].loss, full.steps[i + 4].loss, kLossTol) << "step " << i + 5;
}

// A resharded cp must still split the sequence: seq 24 over cp 5 is refused before any
// write, naming the values that work.
TEST(CpCheckpoint, OfflineReshardRefusesACpThatDoesNotSplitTheSequence) {
  const fs::path src = fresh("cp_refuse_src"), out = fresh("cp_refuse_out");
  run_saving(cp_run(2, "ring"), src);
  const ckpt::Index idx = ckpt::read_index((src / "step-00000004").string());
  try {
    ckpt::write_resharded(idx, ckpt::load_global(idx), options(cp_run(5, "ring"), 8), out.string());
    FAIL() << "cp 5 was not refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_NE(std::string(e.what()).find("--cp 5"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(out / "step-00000004"));
}

}  // namespace
}  // namespace mt::test

// --shuffle (on by default) against the single rank and across a resume: every layout reads
// bitwise the same samples at every step (each global index maps to the same sample, every
// index of the step is read), so the 3D layout's losses stay within the equivalence
// tolerance of the single rank's; a run resumed from a checkpoint reads what the uninterrupted
// run read and its losses are bitwise the same. The samples are seen through
// SequenceSampler's fill observer, which every rank thread calls as it reads.
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <set>

#include "parallel/parallel3d_test_util.h"
#include "train/token_corpus.h"

namespace mt::train {
namespace {

namespace fs = std::filesystem;

// (global index -> sample) of the shuffled training split, as read by any rank.
std::mutex g_mu;
std::map<int64_t, std::set<int64_t>> g_read;

void record(const SequenceSampler& s, int64_t global_index, int64_t sample) {
  if (!s.order().shuffle) return;  // validation reads its split in order
  std::lock_guard lock(g_mu);
  g_read[global_index].insert(sample);
}

struct Reads {
  TrainResult result;
  std::map<int64_t, std::set<int64_t>> samples;
};

Reads run_observed(const TrainOptions& o) {
  {
    std::lock_guard lock(g_mu);
    g_read.clear();
  }
  SequenceSampler::set_fill_observer(record);
  Reads r{run_training(o), {}};
  SequenceSampler::set_fill_observer(nullptr);
  std::lock_guard lock(g_mu);
  r.samples = g_read;
  return r;
}

// Steps [first, last) of a batch of B: every global index read once, as one sample.
void expect_reads(const Reads& r, int64_t first_step, int64_t last_step, int64_t B) {
  ASSERT_EQ(r.samples.size(), static_cast<size_t>((last_step - first_step) * B));
  EXPECT_EQ(r.samples.begin()->first, first_step * B);
  EXPECT_EQ(r.samples.rbegin()->first, last_step * B - 1);
  for (const auto& [g, s] : r.samples) EXPECT_EQ(s.size(), 1u) << "global index " << g;
}

constexpr int64_t kSteps = 6;
// As parallel3d_equiv_test.cpp: a layout changes only the order of f32 sums.
constexpr double kLossTol = 5e-5;

TEST(ShuffleEquiv, EveryLayoutReadsTheSameSamplesAsTheSingleRank) {
  TrainOptions one = test::options3d({}, kSteps);
  ASSERT_TRUE(one.shuffle) << "shuffling is the default";
  const Reads ref = run_observed(one);
  expect_reads(ref, 0, kSteps, one.batch);
  // The order is not the file's: some index reads another sample.
  int64_t moved = 0;
  for (const auto& [g, s] : ref.samples) moved += *s.begin() != g;
  EXPECT_GT(moved, kSteps * one.batch / 2);

  for (const test::Layout3d& l :
       {test::Layout3d{.dp = 2}, test::Layout3d{.tp = 2}, test::Layout3d{.pp = 2},
        test::Layout3d{.dp = 2, .tp = 2, .pp = 2}}) {
    SCOPED_TRACE(test::name_of(l));
    const Reads r = run_observed(test::options3d(l, kSteps));
    EXPECT_EQ(r.samples, ref.samples);  // bitwise the same samples, index by index
    ASSERT_EQ(r.result.steps.size(), ref.result.steps.size());
    for (size_t i = 0; i < r.result.steps.size(); ++i)
      EXPECT_NEAR(r.result.steps[i].loss, ref.result.steps[i].loss, kLossTol) << "step " << i + 1;
  }
  // Another seed reads other samples (the check above can fail).
  TrainOptions other = one;
  other.seed = one.seed + 1;
  EXPECT_NE(run_observed(other).samples, ref.samples);
}

TEST(ShuffleEquiv, AResumeReadsWhatTheUninterruptedRunRead) {
  const fs::path dir = test::dir3d() / "shuffle_resume";
  fs::remove_all(dir);
  const test::Layout3d l{.dp = 2, .tp = 2, .pp = 2};
  TrainOptions o = test::options3d(l, kSteps);
  o.checkpoint_dir = dir.string();
  o.checkpoint_every = kSteps / 2;
  const Reads full = run_observed(o);
  expect_reads(full, 0, kSteps, o.batch);
  TrainOptions r = test::options3d(l, kSteps);
  r.resume = (dir / "step-00000003").string();
  const Reads cont = run_observed(r);
  EXPECT_EQ(cont.result.start_step, kSteps / 2);
  expect_reads(cont, kSteps / 2, kSteps, o.batch);
  for (const auto& [g, s] : cont.samples) EXPECT_EQ(s, full.samples.at(g)) << "global index " << g;
  ASSERT_EQ(cont.result.steps.size(), static_cast<size_t>(kSteps / 2));
  for (size_t i = 0; i < cont.result.steps.size(); ++i)
    EXPECT_EQ(cont.result.steps[i].loss, full.result.steps[i + kSteps / 2].loss)
        << "step " << cont.result.steps[i].step;
}

}  // namespace
}  // namespace mt::train

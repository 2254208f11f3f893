// `meshtrain launch`'s decisions before each start (cli/launch_layout.h): the hostfile, and
// the layout that fits the hosts that answer — dp shrinks first, then tp x pp, the planner
// ranking layouts of as many ranks; never more ranks than the first layout.
#include "cli/launch_layout.h"

#include <gtest/gtest.h>

#include <fstream>

#include "core/error.h"
#include "model/config.h"
#include "test_util.h"

namespace mt::cli::launch {
namespace {

train::TrainOptions tiny_job(int64_t batch) {
  train::TrainOptions o;
  o.model = model::preset("tiny");  // 4 heads, 4 layers
  o.batch = batch;
  o.data = "tokens.bin";  // validate wants a path; nothing reads it
  return o;
}

std::string write(const std::filesystem::path& dir, const std::string& text) {
  const std::string path = (dir / "hosts").string();
  std::ofstream(path) << text;
  return path;
}

TEST(LaunchHostfile, ReadsNamesAndSlots) {
  const auto dir = test::scratch_dir("launch-hostfile");
  const std::vector<Host> h = read_hostfile(
      write(dir, "# two hosts\nmt-h0 slots=2\n\n  mt-h1 slots=4 max_slots=8 # x\nlone\n"));
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(h[0].name, "mt-h0");
  EXPECT_EQ(h[0].slots, 2);
  EXPECT_EQ(h[1].slots, 4);
  EXPECT_EQ(h[2].slots, 1);  // Open MPI's default
  EXPECT_EQ(hostfile_text(h), "mt-h0 slots=2\nmt-h1 slots=4\nlone slots=1\n");
}

TEST(LaunchHostfile, RefusesWhatItCannotUse) {
  const auto dir = test::scratch_dir("launch-hostfile-bad");
  auto message = [&](const std::string& text) {
    try {
      read_hostfile(write(dir, text));
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ExitCode::kBadInput);
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message("a slots=x\n").find("line 1: 'slots=x' is not a slot count"),
            std::string::npos);
  EXPECT_NE(message("a slots=0\n").find("slots=N, N >= 1"), std::string::npos);
  EXPECT_NE(message("a\nb\na\n").find("line 3: host 'a' is named twice"), std::string::npos);
  EXPECT_NE(message("# none\n").find("names no host"), std::string::npos);
  EXPECT_THROW(read_hostfile((dir / "missing").string()), Error);
}

// dp shrinks first, to the largest that divides the global batch; tp and pp stay.
TEST(LaunchLayout, DpShrinksFirstKeepingTheBatch) {
  const train::TrainOptions job = tiny_job(12);
  const Layout first{3, 2, 1};
  auto dp_at = [&](int slots) {
    const std::optional<Choice> c = choose_layout(job, first, slots, {});
    EXPECT_TRUE(c.has_value());
    if (!c) return Layout{};
    EXPECT_EQ(c->why, "dp shrinks first");
    return c->layout;
  };
  EXPECT_EQ(dp_at(6), (Layout{3, 2, 1}));
  EXPECT_EQ(dp_at(5), (Layout{2, 2, 1}));
  EXPECT_EQ(dp_at(4), (Layout{2, 2, 1}));
  EXPECT_EQ(dp_at(2), (Layout{1, 2, 1}));
  EXPECT_EQ(dp_at(12), (Layout{3, 2, 1}));  // never past the first layout
  // dp 5 does not divide 12: 4.
  EXPECT_EQ(choose_layout(job, {5, 2, 1}, 10, {}).value().layout, (Layout{4, 2, 1}));
}

// Where even dp 1 does not fit, tp x pp shrink; layouts of as many ranks are ranked by the
// model (the fastest first), or without one the larger tp is kept.
TEST(LaunchLayout, ThePlannerRanksLayoutsOfAsManyRanks) {
  const train::TrainOptions job = tiny_job(8);
  const Layout first{1, 2, 2};
  const std::optional<Choice> plain = choose_layout(job, first, 2, {});
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->layout, (Layout{1, 2, 1}));
  EXPECT_NE(plain->why.find("3 layouts of 2 ranks fit"), std::string::npos) << plain->why;
  // A model that finds the pipeline fastest, dp next.
  const StepTimeModel model = [](const Layout& l) -> std::optional<double> {
    if (l.pp == 2) return 1.0;
    if (l.dp == 2) return 2.0;
    return std::nullopt;
  };
  const std::optional<Choice> ranked = choose_layout(job, first, 3, model);
  ASSERT_TRUE(ranked);
  EXPECT_EQ(ranked->layout, (Layout{1, 1, 2}));
  EXPECT_NE(ranked->why.find("the planner ranks 3 layouts of 2 ranks: dp 1 x tp 2 x pp 1 (not "
                             "modelled), dp 1 x tp 1 x pp 2 1 s/step, dp 2 x tp 1 x pp 1 2 s/step"),
            std::string::npos)
      << ranked->why;
  EXPECT_FALSE(choose_layout(job, first, 0, model));
}

// cp and ep are the job's: every layout keeps them. cp multiplies the ranks of a layout; ep
// is carved from dp, so dp shrinks to multiples of ep only, and below that tp shrinks.
TEST(LaunchLayout, CpAndEpAreKeptWhileDpShrinks) {
  train::TrainOptions cp_job = tiny_job(12);
  cp_job.model.seq_len = 64;
  cp_job.cp = 2;
  const Layout cp_first{3, 2, 1, 2, 1};
  EXPECT_EQ(cp_first.ranks(), 12);
  EXPECT_EQ(cp_first.text(), "dp 3 x tp 2 x pp 1 x cp 2");
  auto pick = [](const train::TrainOptions& job, const Layout& first, int slots) {
    const std::optional<Choice> c = choose_layout(job, first, slots, {});
    return c ? c->layout : Layout{0, 0, 0, 0, 0};
  };
  EXPECT_EQ(pick(cp_job, cp_first, 12), (Layout{3, 2, 1, 2, 1}));
  EXPECT_EQ(pick(cp_job, cp_first, 11), (Layout{2, 2, 1, 2, 1}));
  EXPECT_EQ(pick(cp_job, cp_first, 4), (Layout{1, 2, 1, 2, 1}));
  EXPECT_EQ(pick(cp_job, cp_first, 3), (Layout{1, 1, 1, 2, 1}));  // tp shrinks, cp stays
  EXPECT_FALSE(choose_layout(cp_job, cp_first, 1, {}));           // cp 2 needs 2 ranks

  train::TrainOptions ep_job = tiny_job(12);
  ep_job.model.moe.n_experts = 4;
  ep_job.ep = 2;
  const Layout ep_first{4, 2, 1, 1, 2};
  EXPECT_EQ(ep_first.text(), "dp 4 x tp 2 x pp 1 (ep 2 of dp)");
  EXPECT_EQ(pick(ep_job, ep_first, 7), (Layout{2, 2, 1, 1, 2}));  // dp 3 is no multiple of 2
  EXPECT_EQ(pick(ep_job, ep_first, 3), (Layout{2, 1, 1, 1, 2}));  // dp 1 < ep: tp shrinks
  EXPECT_FALSE(choose_layout(ep_job, ep_first, 1, {}));           // ep 2 needs dp 2
}

// The planner's model itself: a step time for each layout it models, and an empty model
// with the reason where the cluster cannot be read.
TEST(LaunchLayout, PlannerStepTime) {
  train::TrainOptions job = tiny_job(8);
  job.model.seq_len = 64;
  std::string why;
  const StepTimeModel m = planner_step_time(job, "dgx-a100", &why);
  ASSERT_TRUE(m) << why;
  const std::optional<double> one = m({1, 1, 1}), four = m({4, 1, 1});
  ASSERT_TRUE(one && four);
  EXPECT_GT(*one, 0);
  EXPECT_GT(*four, 0);
  EXPECT_NE(*one, *four);  // another layout, another prediction
  EXPECT_FALSE(planner_step_time(job, "/no/such/cluster.json", &why));
  EXPECT_NE(why.find("/no/such/cluster.json"), std::string::npos) << why;
}

// Launch stopped the job to grow (SIGUSR1). Before its last step the job saves and exits 3:
// grow; it failed otherwise. At its last step nothing is left to grow into, whatever the
// exit: 0, 3, or killed by the signal itself as the process was ending (138, seen in
// bench/multihost: the restart that followed trained nothing and counted as a failure).
TEST(LaunchLayout, AJobPastItsLastStepWhenTheGrowSignalCameIsDone) {
  EXPECT_EQ(after_grow_signal(3, 12, 30), AfterGrowSignal::kGrow);
  EXPECT_EQ(after_grow_signal(138, 12, 30), AfterGrowSignal::kFailed);
  EXPECT_EQ(after_grow_signal(1, 12, 30), AfterGrowSignal::kFailed);
  EXPECT_EQ(after_grow_signal(138, 30, 30), AfterGrowSignal::kDone);
  EXPECT_EQ(after_grow_signal(3, 30, 30), AfterGrowSignal::kDone);
  EXPECT_EQ(after_grow_signal(0, 30, 30), AfterGrowSignal::kDone);
}

}  // namespace
}  // namespace mt::cli::launch

// Equivalence: every pipeline schedule at pp 2 and 4 with m = pp, 2pp, 4pp microbatches
// trains the same model as the single rank with the same global batch (DESIGN.md, idea 2).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "parallel/pipeline/buffers.h"
#include "parallel/pipeline/schedule.h"
#include "pipeline_test_util.h"

namespace mt::train {
namespace {

// Tolerance. The pipeline differs from the single rank only in the order of f32 sums: weight
// gradients are accumulated over m microbatches instead of one GEMM over the batch, the tied
// wte gradient is the sum of the embedding's and the LM head's shares computed on two ranks,
// the loss and the squared norm are summed per stage (f32 relative rounding ~1e-6 over a
// sum). As for data parallelism (docs/data_parallel.md), Adam turns such differences into
// parameter differences of ~1e-5 over 20 steps at lr 1e-3, moving the loss by ~1e-5.
constexpr double kLossTol = 5e-5;
constexpr int64_t kSteps = 20;

const TrainResult& oracle() {
  static const TrainResult r = run_training(test::pp_options(1, 0, "1f1b", 1, kSteps));
  return r;
}

class PipelineEquiv : public ::testing::TestWithParam<std::tuple<int, int, std::string>> {};

TEST_P(PipelineEquiv, LossesMatchTheSingleRank) {
  const auto [P, k, schedule] = GetParam();
  const int m = k * P;
  const int v = schedule == "interleaved" ? 2 : 1;
  const TrainResult& ref = oracle();
  const TrainResult r = run_training(test::pp_options(P, m, schedule, v, kSteps));
  ASSERT_EQ(ref.steps.size(), static_cast<size_t>(kSteps));  // sizes first: every step compared
  ASSERT_EQ(r.steps.size(), ref.steps.size());
  ASSERT_EQ(r.pipeline.size(), static_cast<size_t>(P));  // it did run the pipeline
  EXPECT_EQ(r.pipeline.back().chunks.back(), P * v - 1);
  double worst = 0;
  for (size_t i = 0; i < r.steps.size(); ++i) {
    EXPECT_NEAR(r.steps[i].loss, ref.steps[i].loss, kLossTol) << "step " << i + 1;
    EXPECT_NEAR(r.steps[i].grad_norm, ref.steps[i].grad_norm, 1e-4 * ref.steps[i].grad_norm)
        << "step " << i + 1;
    worst = std::max(worst, std::abs(static_cast<double>(r.steps[i].loss) - ref.steps[i].loss));
  }
  std::printf("pp %d m %d %s: max |loss diff| %.2e over %lld steps (final loss %.4f)\n", P, m,
              schedule.c_str(), worst, static_cast<long long>(kSteps), r.steps.back().loss);
}

INSTANTIATE_TEST_SUITE_P(Schedules, PipelineEquiv,
                         ::testing::Combine(::testing::Values(2, 4), ::testing::Values(1, 2, 4),
                                            ::testing::Values("gpipe", "1f1b", "interleaved",
                                                              "zb1")),
                         [](const auto& info) {
                           const int P = std::get<0>(info.param);
                           return "pp" + std::to_string(P) + "_m" +
                                  std::to_string(std::get<1>(info.param) * P) + "_" +
                                  std::get<2>(info.param);
                         });

// pp x dp: the mesh pp 2 x dp 2 (pp slowest) with ZB-H1 equals the single rank too.
TEST(PipelineEquivDp, PipelineTimesDataParallel) {
  TrainOptions o = test::pp_options(2, 4, "zb1", 1, kSteps);
  o.dp = 2;
  const TrainResult r = run_training(o);
  ASSERT_EQ(r.steps.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(oracle().steps.size(), r.steps.size());
  for (size_t i = 0; i < r.steps.size(); ++i)
    EXPECT_NEAR(r.steps[i].loss, oracle().steps[i].loss, kLossTol) << "step " << i + 1;
}

// --pp-layers with the first chunk the embedding alone and the last the LM head alone (Llama 3
// 405B's split; docs/pipeline.md, "Partitioning"): the same model as the single rank, within
// the pipeline's tolerance, in training and in validation (forward_only). A chunk that sent a
// stale buffer instead of the embedding's output, or a head that read one instead of the last
// block's, would train another model: the loss moves by far more than kLossTol at step 2.
TEST(PipelineEmptyEnds, EmbeddingAloneAndHeadAloneMatchTheSingleRank) {
  TrainOptions base = test::pp_options(1, 0, "1f1b", 1, kSteps);
  base.eval_every = 10;
  const TrainResult ref = run_training(base);
  for (const auto& [S, P, v, layers] :
       {std::tuple{"interleaved", 2, 2, "0,4,4,0"}, std::tuple{"1f1b", 3, 1, "0,8,0"},
        std::tuple{"zb1", 2, 1, "0,8"}, std::tuple{"interleaved", 2, 3, "0,2,2,2,2,0"}}) {
    SCOPED_TRACE(testing::Message() << S << " pp " << P << " v " << v << " " << layers);
    TrainOptions o = test::pp_options(P, 4, S, v, kSteps);
    o.pipeline.layers = layers;
    o.eval_every = 10;
    const TrainResult r = run_training(o);
    ASSERT_EQ(r.steps.size(), ref.steps.size());
    ASSERT_EQ(r.pipeline.size(), static_cast<size_t>(P));
    for (size_t i = 0; i < r.steps.size(); ++i) {
      EXPECT_NEAR(r.steps[i].loss, ref.steps[i].loss, kLossTol) << "step " << i + 1;
      EXPECT_NEAR(r.steps[i].grad_norm, ref.steps[i].grad_norm, 1e-4 * ref.steps[i].grad_norm)
          << "step " << i + 1;
    }
    ASSERT_EQ(r.val_losses.size(), ref.val_losses.size());
    for (size_t i = 0; i < r.val_losses.size(); ++i)
      EXPECT_NEAR(r.val_losses[i].second, ref.val_losses[i].second, kLossTol);
  }
}

// The interleaved schedule with a microbatch count pp does not divide (groups of N > pp
// consecutive microbatches, parallel/pipeline/schedule.h): the same model as the single rank,
// and the stage holds the buffers its plan names (parallel/pipeline/buffers.h; before the plan,
// pp 3 v 2 m 16 hung in 1 run of 4 under load: a free buffer taken whose send's receiver
// waited on this rank).
TEST(PipelineEquivAnyCount, InterleavedWithMicrobatchesPpDoesNotDivide) {
  for (int m : {4, 8, 16}) {
    SCOPED_TRACE(testing::Message() << "interleaved pp 3 v 2 m " << m);
    const TrainResult r = run_training(test::pp_options(3, m, "interleaved", 2, kSteps));
    ASSERT_EQ(r.steps.size(), oracle().steps.size());
    ASSERT_EQ(r.pipeline.size(), 3u);
    for (size_t i = 0; i < r.steps.size(); ++i) {
      EXPECT_NEAR(r.steps[i].loss, oracle().steps[i].loss, kLossTol) << "step " << i + 1;
      EXPECT_NEAR(r.steps[i].grad_norm, oracle().steps[i].grad_norm,
                  1e-4 * oracle().steps[i].grad_norm)
          << "step " << i + 1;
    }
    const parallel::pp::Schedule s =
        parallel::pp::build_schedule(parallel::pp::ScheduleKind::kInterleaved1F1B, 3, m, 2);
    const parallel::pp::BufferPlan plan = parallel::pp::plan_buffers(s);
    for (int p = 0; p < 3; ++p)
      EXPECT_EQ(r.pipeline[size_t(p)].pool_buffers, plan.buffers[size_t(p)]) << "rank " << p;
  }
}

// Megatron-LM's batched exchanges (--pp-exchanges batched, the default on NCCL) only group
// the sends and receives differently: the same compute in the same order, so bitwise the
// same losses as the per-action lists, and no more activation buffers.
TEST(PipelineEquivExchanges, BatchedExchangesTrainBitwiseTheSame) {
  // ZB-H1's batched lists also move sends (after a W: BatchedZbH1KeepsItsBubble).
  for (const auto& [S, P, m, v] :
       {std::tuple{"interleaved", 4, 8, 2}, std::tuple{"interleaved", 2, 4, 2},
        std::tuple{"interleaved", 2, 2, 4}, std::tuple{"zb1", 4, 8, 1}, std::tuple{"zb1", 2, 8, 1},
        std::tuple{"zb1", 4, 16, 1}}) {
    SCOPED_TRACE(testing::Message() << S << " pp " << P << " m " << m << " v " << v);
    TrainOptions o = test::pp_options(P, m, S, v, 6);
    o.pipeline.exchanges = "per-action";
    const TrainResult a = run_training(o);
    o.pipeline.exchanges = "batched";
    const TrainResult b = run_training(o);
    ASSERT_EQ(a.steps.size(), b.steps.size());
    for (size_t i = 0; i < a.steps.size(); ++i) EXPECT_EQ(a.steps[i].loss, b.steps[i].loss);
    ASSERT_EQ(a.pipeline.size(), b.pipeline.size());
    for (size_t r = 0; r < a.pipeline.size(); ++r) {
      EXPECT_EQ(a.pipeline[r].held_peak, b.pipeline[r].held_peak) << "rank " << r;
      EXPECT_EQ(a.pipeline[r].pool_buffers, b.pipeline[r].pool_buffers) << "rank " << r;
      EXPECT_EQ(a.pipeline[r].activation_peak_bytes, b.pipeline[r].activation_peak_bytes)
          << "rank " << r;
    }
  }
}

}  // namespace
}  // namespace mt::train

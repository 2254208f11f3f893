// Memory: the accounting allocator's peak bytes of parameters + gradients + optimizer state
// per rank against the ZeRO formulas for f32 training (docs/data_parallel.md):
//   stage 0: 16Ψ   stage 1: 8Ψ + 8Ψ/N   stage 2: 4Ψ + 12Ψ/N   stage 3: 16Ψ/N
// plus the stated unit buffers of stages 2 and 3.
#include <gtest/gtest.h>

#include "dp_test_util.h"
#include "model/params.h"

namespace mt::train {
namespace {

struct Units {
  int64_t embed = 0, block = 0, head = 0;
};
// The units' sizes from the config alone (not from the code under test).
Units units_of(const model::GptConfig& c) {
  const int64_t C = c.d_model, F = c.d_ff;
  Units u;
  u.embed = c.padded_vocab() * C + c.seq_len * C;
  u.block = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (F * C + F) + (C * F + C);
  u.head = 2 * C;
  return u;
}

class ZeroMemory : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(ZeroMemory, PeakPerRankMatchesTheFormula) {
  const auto [N, stage] = GetParam();
  TrainOptions o = test::dp_options(N, stage, 2);
  o.model.n_layer = 6;  // enough blocks that ZeRO-3's two block slots are a small part
  const TrainResult r = run_training(o);
  const double psi = static_cast<double>(model::count_params(model::gpt_param_specs(o.model)));
  const Units u = units_of(o.model);
  // ZeRO-2/3 unit pools: slot 0 the embeddings, slot 1 the head (+ the padding, < N
  // elements), two block slots; f32, so 4 bytes an element.
  EXPECT_EQ(r.padded_params, test::padded_param_elems(o.model, N));
  const double pad = static_cast<double>(test::padded_param_elems(o.model, N)) - psi;
  const double pool = 4.0 * (u.embed + u.head + pad + 2 * u.block);
  EXPECT_EQ(pool, 4.0 * static_cast<double>(test::zero_pool_elems(o.model, N)));
  double expect = 0;
  switch (stage) {
    case 0:
      expect = 16 * psi;
      break;
    case 1:
      expect = 8 * psi + 8 * psi / N;
      break;
    case 2:
      expect = 4 * psi + 12 * psi / N + pool;
      break;  // + gradient pool
    case 3:
      expect = 16 * psi / N + 2 * pool;
      break;  // + value and gradient pools
  }
  ASSERT_EQ(r.ranks.size(), static_cast<size_t>(N));
  for (const RankRecord& rk : r.ranks) {
    const mem::Snapshot& m = rk.memory;
    const double measured = static_cast<double>(m.peak_of(mem::Category::kParameters) +
                                                m.peak_of(mem::Category::kGradients) +
                                                m.peak_of(mem::Category::kOptimizer));
    EXPECT_NEAR(measured, expect, 0.05 * expect) << "rank " << rk.rank;
    // Exactly, with Ψ padded to Ψp = a multiple of N (shard S = Ψp / N):
    // (Ψp and the pools from the config, not from the trainer's report of them.)
    const double P = static_cast<double>(test::padded_param_elems(o.model, N)), S = P / N;
    const double exact[4] = {16 * P - 8 * pad, 8 * P + 8 * S, 4 * P + 12 * S + pool,
                             16 * S + 2 * pool};
    // (stage 0's Adam moments cover the real Ψ only: 8 bytes less per padding element.)
    EXPECT_EQ(measured, exact[stage]) << "rank " << rk.rank;
  }
  if (stage >= 2) {
    EXPECT_EQ(4.0 * static_cast<double>(r.gradient_pool_elems), pool);
  }
  if (stage == 3) {
    EXPECT_EQ(4.0 * static_cast<double>(r.gathered_param_elems), pool);
  }
  const mem::Snapshot& m0 = r.ranks[0].memory;
  std::printf("N %d stage %d: rank 0 %lld bytes (formula %.0f; 16Ψ = %.0f)\n", N, stage,
              static_cast<long long>(m0.peak_of(mem::Category::kParameters) +
                                     m0.peak_of(mem::Category::kGradients) +
                                     m0.peak_of(mem::Category::kOptimizer)),
              expect, 16 * psi);
}

INSTANTIATE_TEST_SUITE_P(Stages, ZeroMemory,
                         ::testing::Combine(::testing::Values(1, 2, 4, 8),
                                            ::testing::Values(0, 1, 2, 3)),
                         [](const auto& info) {
                           return "dp" + std::to_string(std::get<0>(info.param)) + "_zero" +
                                  std::to_string(std::get<1>(info.param));
                         });

// Every stage: the steady-state step allocates nothing (buffers, pools and shards are all
// made before step 1).
TEST(ZeroMemoryAllocations, SteadyStateAllocatesNothingInAnyStage) {
  for (int zero = 0; zero <= 3; ++zero) {
    TrainOptions o = test::dp_options(2, zero, 4);
    o.microbatch = 2;  // accumulation too
    EXPECT_EQ(run_training(o).allocations_after_first_step, 0) << "zero " << zero;
  }
}

}  // namespace
}  // namespace mt::train

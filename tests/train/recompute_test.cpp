// Activation recomputation (--recompute selective / full) changes what is kept, never what
// is computed: the same losses, gradient norms and weights bit for bit, on the single rank,
// with tp + sp, and inside pipeline stages; and the activation memory per rank falls by
// exactly what the formulas say (docs/parallel_3d.md).
#include <gtest/gtest.h>

#include <algorithm>

#include "../parallel/parallel3d_test_util.h"

namespace mt::train {
namespace {

struct Case {
  test::Layout3d layout;
  std::string name;
};

TrainResult run(const test::Layout3d& l, const std::string& recompute, const std::string& tag) {
  TrainOptions o = test::options3d(l, 3);
  o.recompute = recompute;
  o.export_path = (test::dir3d() / (tag + "_" + recompute + ".safetensors")).string();
  return run_training(o);
}

class Recompute : public ::testing::TestWithParam<Case> {};

// Bytes of one block's activations (f32), what selective recomputation drops (the attention
// probabilities) and what full recomputation keeps (the block's output).
struct BlockBytes {
  int64_t all, att, out;
};
BlockBytes block_bytes(const TrainOptions& o) {
  const int64_t t = o.tp, B = o.microbatch_size(), T = o.model.seq_len, N = B * T;
  const int64_t Nl = o.sp ? N / t : N, C = o.model.d_model, F = o.model.d_ff, H = o.model.n_head;
  const int64_t att = 4 * B * (H / t) * T * T;
  const int64_t all = 4 * (4 * Nl * C + 4 * Nl + 3 * N * C / t + N * C / t + 2 * N * F / t) + att;
  return {all, att, 4 * Nl * C};
}

TEST_P(Recompute, SameBitsAndLessActivationMemory) {
  const Case& c = GetParam();
  const TrainResult none = run(c.layout, "none", c.name);
  const TrainOptions o = test::options3d(c.layout, 3);
  const BlockBytes bb = block_bytes(o);
  const std::vector<std::string> modes = c.layout.schedule == "zb1" && c.layout.pp > 1
                                             ? std::vector<std::string>{"selective"}
                                             : std::vector<std::string>{"selective", "full"};
  for (const std::string& mode : modes) {
    const TrainResult r = run(c.layout, mode, c.name);
    ASSERT_EQ(r.steps.size(), none.steps.size());
    for (size_t i = 0; i < r.steps.size(); ++i) {
      EXPECT_EQ(r.steps[i].loss, none.steps[i].loss) << mode << " step " << i + 1;
      EXPECT_EQ(r.steps[i].grad_norm, none.steps[i].grad_norm) << mode << " step " << i + 1;
    }
    EXPECT_EQ(test::max_weight_diff(test::dir3d() / (c.name + "_" + mode + ".safetensors"),
                                    test::dir3d() / (c.name + "_none.safetensors"), nullptr),
              0.0)
        << mode;
    EXPECT_EQ(r.allocations_after_first_step, 0) << mode;
    // Activation memory, rank by rank: n block sets kept; recomputation keeps one whole set
    // plus, per block, everything but the attention probabilities (selective) or only the
    // output (full).
    for (size_t k = 0; k < r.ranks.size(); ++k) {
      int64_t sets = o.model.n_layer;
      if (c.layout.pp > 1) {
        const PipelineRankStats& st = r.pipeline[k];
        sets = st.pool_buffers * *std::max_element(st.chunk_layers.begin(), st.chunk_layers.end());
      }
      const int64_t expect =
          mode == "selective" ? -(sets - 1) * bb.att : bb.all + sets * (bb.out - bb.all);
      const int64_t got = r.ranks[k].memory.peak_of(mem::Category::kActivations) -
                          none.ranks[k].memory.peak_of(mem::Category::kActivations);
      EXPECT_EQ(got, expect) << mode << " rank " << k;
      if (k == 0)
        std::printf("%s %s: activations %.1f KiB -> %.1f KiB\n", c.name.c_str(), mode.c_str(),
                    none.ranks[k].memory.peak_of(mem::Category::kActivations) / 1024.0,
                    r.ranks[k].memory.peak_of(mem::Category::kActivations) / 1024.0);
    }
  }
}

using L = test::Layout3d;
INSTANTIATE_TEST_SUITE_P(
    Layouts, Recompute,
    ::testing::Values(Case{L{}, "single"}, Case{L{1, 2, 1, 0, "1f1b", 1, true}, "tp2_sp"},
                      Case{L{1, 2, 2, 0}, "tp2_pp2"},
                      Case{L{2, 1, 2, 3, "zb1"}, "dp2_pp2_zb1_zero3"},
                      Case{L{1, 1, 2, 0, "interleaved", 2}, "pp2_interleaved"}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace mt::train

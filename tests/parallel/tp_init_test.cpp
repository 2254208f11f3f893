// Layout independence of the initialisation: every tp rank's shard of every parameter
// equals the matching slice of the single-rank model (kQkvRows: the rank's heads inside
// each of q, k and v), and the refusals of a tp that does not divide the model.
#include <gtest/gtest.h>

#include <array>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/gpt.h"

namespace mt::model {
namespace {

// The slice of rank r of t of a global [rows, cols] tensor (a 1-D one: cols 1), written from
// the definition element by element: an independent path, not tp_slice / for_each_tp_run,
// which the initialisation itself goes through.
std::vector<float> expected_slice(const ParamSpec& s, const float* whole) {
  const Shape& g = s.full_shape();
  const int64_t rows = g[0], cols = g.size() > 1 ? g[1] : 1;
  const int64_t t = s.tp_size, r = s.tp_rank;
  std::vector<float> out;
  auto take = [&](int64_t row, int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) out.push_back(whole[row * cols + c]);
  };
  switch (s.tp_split) {
    case TpSplit::kReplicated:
      for (int64_t i = 0; i < rows; ++i) take(i, 0, cols);
      break;
    case TpSplit::kRows:
      for (int64_t i = r * rows / t; i < (r + 1) * rows / t; ++i) take(i, 0, cols);
      break;
    case TpSplit::kCols:
      for (int64_t i = 0; i < rows; ++i) take(i, r * cols / t, (r + 1) * cols / t);
      break;
    case TpSplit::kBlockRows: {
      int64_t first = 0;  // the block's first global row
      for (int64_t block : s.row_blocks) {
        for (int64_t i = first + r * block / t; i < first + (r + 1) * block / t; ++i)
          take(i, 0, cols);
        first += block;
      }
      break;
    }
  }
  return out;
}

TEST(TpInit, EveryShardIsTheSliceOfTheSingleRankWeights) {
  GptConfig c = preset("tiny");
  c.n_layer = 1;
  const Gpt whole(c, 42);
  for (int t : {2, 4}) {
    for (int r = 0; r < t; ++r) {
      parallel::tp::TpContext tp;
      tp.rank = r;
      tp.size = t;
      const Gpt shard(c, 42, {}, tp);
      ASSERT_EQ(shard.params().params().size(), whole.params().params().size());
      for (size_t i = 0; i < whole.params().params().size(); ++i) {
        const Param& w = whole.params().params()[i];
        const Param& s = shard.params().params()[i];
        ASSERT_EQ(s.spec.full_shape(), w.spec.shape) << s.spec.name;  // same global tensor
        const std::vector<float> want = expected_slice(s.spec, w.value.f32());
        ASSERT_EQ(static_cast<int64_t>(want.size()), s.value.numel()) << s.spec.name;
        for (int64_t k = 0; k < s.value.numel(); ++k)
          ASSERT_EQ(s.value.f32()[k], want[static_cast<size_t>(k)])
              << s.spec.name << " t " << t << " rank " << r << " element " << k;
        // The check sees a shifted slice: the neighbour rank's slice of a split tensor
        // drawn from a random init differs (a zero-initialised one, e.g. a bias, is all 0).
        if (s.spec.tp_split != TpSplit::kReplicated && s.spec.init == Init::kNormal) {
          ParamSpec shifted = s.spec;
          shifted.tp_rank = (r + 1) % t;
          EXPECT_NE(expected_slice(shifted, w.value.f32()),
                    std::vector<float>(s.value.f32(), s.value.f32() + s.value.numel()))
              << s.spec.name << ": the check would not see a shifted slice";
        }
      }
    }
  }
}

TEST(TpInit, QkvShardHoldsWholeHeadsOfEachOfQKV) {
  ParamSpec s;
  s.name = "q";
  s.shape = {3 * 8, 2};  // C = 8: q rows 0..7, k 8..15, v 16..23
  s.tp_split = TpSplit::kBlockRows;
  s.row_blocks = {8, 8, 8};
  const auto sharded = tp_shard_specs({s}, 1, 2);
  ASSERT_EQ(sharded[0].shape, (Shape{12, 2}));
  std::vector<std::pair<int64_t, int64_t>> runs;
  for_each_tp_run(sharded[0], [&](int64_t local, int64_t global, int64_t n) {
    runs.emplace_back(global, n);
    EXPECT_EQ(local % 8, 0);
  });
  // rank 1 of 2: rows 4..7 of q, 12..15 of k, 20..23 of v (2 columns each).
  EXPECT_EQ(runs, (std::vector<std::pair<int64_t, int64_t>>{{8, 8}, {24, 8}, {40, 8}}));
}

TEST(TpInit, GroupedQueryShardHoldsItsQueryAndKvHeads) {
  // C = 8 (4 heads of 2), 2 kv heads: q rows 0..7, k 8..11, v 12..15; rank 1 of 2 holds
  // q heads 2, 3 (rows 4..7), kv head 1 (k rows 10, 11; v rows 14, 15).
  ParamSpec s;
  s.name = "qkv";
  s.shape = {16, 2};
  s.tp_split = TpSplit::kBlockRows;
  s.row_blocks = {8, 4, 4};
  const auto sharded = tp_shard_specs({s}, 1, 2);
  ASSERT_EQ(sharded[0].shape, (Shape{8, 2}));
  std::vector<std::array<int64_t, 3>> runs;
  for_each_tp_run(sharded[0], [&](int64_t local, int64_t global, int64_t n) {
    runs.push_back({local, global, n});
  });
  EXPECT_EQ(runs, (std::vector<std::array<int64_t, 3>>{{0, 8, 8}, {8, 20, 4}, {12, 28, 4}}));
  s.row_blocks = {8, 3, 5};  // a block that does not split is refused
  EXPECT_THROW(tp_shard_specs({s}, 0, 2), Error);
}

TEST(TpInit, RefusesATpThatDoesNotDivide) {
  GptConfig c = preset("tiny");  // 4 heads, d_ff 512
  try {
    check_tp(c, 3, false);
    FAIL() << "not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--tp 3 does not divide n_head=4"), std::string::npos)
        << e.what();
  }
  c.n_head = 8;
  c.d_model = 128;
  c.d_ff = 204;
  EXPECT_THROW(check_tp(c, 8, false), Error);  // d_ff 204 % 8
  c.d_ff = 512;
  c.seq_len = 30;
  EXPECT_THROW(check_tp(c, 4, true), Error);
  EXPECT_NO_THROW(check_tp(c, 4, false));
  EXPECT_EQ(tp_vocab_pad(3), 384);
  EXPECT_EQ(tp_vocab_pad(4), 128);
}

}  // namespace
}  // namespace mt::model

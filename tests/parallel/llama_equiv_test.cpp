// A Llama-family model (RMSNorm, rotary positions with Llama 3 scaling, SwiGLU, grouped-query
// attention with 8 query heads sharing 4 key/value heads, no biases, untied) in composed
// layouts against its single rank, in f32 and in bf16 against the bf16 single rank: the
// loss and gradient norm at every step, the validation loss and every exported weight. The
// same block and the same tp/pp/dp code as GPT-2's (parallel3d_equiv_test.cpp), so the
// tolerances are those files' (their comments derive them).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <string>

#include "core/error.h"
#include "equiv_check.h"
#include "parallel3d_test_util.h"
#include "train/verify.h"

namespace mt::train {
namespace {

using test::kBf16;
using test::kF32;
using test::Precision;

TrainOptions llama_options(const test::Layout3d& l, const Precision& p) {
  TrainOptions o = test::options3d(l, p.steps);
  test::make_llama3d(o.model);
  o.dtype = p.dtype;
  return o;
}

void check(const test::Layout3d& l, const Precision& p) {
  test::check_equiv(std::string("llama_") + p.dtype, l, p,
                    [&](const test::Layout3d& x) { return llama_options(x, p); });
}

using L = test::Layout3d;
class LlamaEquiv : public ::testing::TestWithParam<L> {};
TEST_P(LlamaEquiv, F32MatchesTheSingleRank) { check(GetParam(), kF32); }
INSTANTIATE_TEST_SUITE_P(Layouts, LlamaEquiv,
                         ::testing::Values(L{1, 2, 1, 0, "1f1b", 1, true},  // tp 2 + sp, GQA
                                           L{1, 1, 2, 0, "interleaved", 2}, L{1, 1, 2, 0, "zb1"},
                                           L{2, 1, 1, 3}, L{2, 2, 2, 1}, L{1, 4, 1, 0}),
                         [](const auto& info) { return test::name_of(info.param); });

class LlamaEquivBf16 : public ::testing::TestWithParam<L> {};
TEST_P(LlamaEquivBf16, MatchesTheBf16SingleRank) { check(GetParam(), kBf16); }
INSTANTIATE_TEST_SUITE_P(Layouts, LlamaEquivBf16,
                         ::testing::Values(L{1, 2, 1, 0, "1f1b", 1, true}, L{2, 2, 2, 3}),
                         [](const auto& info) { return test::name_of(info.param); });

// Fine-tuning: a run exports a Hugging Face folder; a run in another layout starts from it
// (--init-from, each rank loading its own slice) and, before any real update (lr 1e-12: Adam
// moves a weight by at most lr per step), reports the exporting run's validation loss. The
// layouts differ only in f32 summation order (parallel3d_equiv_test's 5e-5 on the loss).
TEST(LlamaInitFrom, AnotherLayoutReproducesTheExportingRunsValidationLoss) {
  TrainOptions a = llama_options({}, kF32);
  a.export_path = (test::dir3d() / "llama_finetune_base").string();
  const TrainResult ra = run_training(a);
  ASSERT_FALSE(ra.val_losses.empty());
  for (const test::Layout3d& l :
       {test::Layout3d{2, 2, 2, 3}, test::Layout3d{1, 2, 1, 0, "1f1b", 1, true}}) {
    TrainOptions b = llama_options(l, kF32);
    b.steps = 1;
    b.lr = 1e-12f;
    b.init_from = a.export_path;
    const TrainResult rb = run_training(b);
    ASSERT_FALSE(rb.val_losses.empty());
    EXPECT_NEAR(rb.val_losses.back().second, ra.val_losses.back().second, kF32.loss_tol)
        << test::name_of(l);
    std::printf("llama init-from %s: validation loss %.7f, exporting run %.7f\n",
                test::name_of(l).c_str(), rb.val_losses.back().second, ra.val_losses.back().second);
  }
  // A model that is not the file's is refused, naming both.
  TrainOptions c = llama_options({}, kF32);
  c.model.n_layer = 2;
  c.init_from = a.export_path;
  try {
    run_training(c);
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds another model than this run builds"),
              std::string::npos)
        << e.what();
  }
}

// tp must divide the key/value heads too: 8 query heads over tp 8 would leave half a kv head.
TEST(LlamaLayout, TpThatDoesNotDivideTheKvHeadsIsRefused) {
  TrainOptions o = llama_options({1, 8, 1, 0}, kF32);
  try {
    run_training(o);
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("--tp 8 does not divide n_kv_head=4"), std::string::npos) << m;
    EXPECT_NE(m.find("choose --tp among 1, 2, 4"), std::string::npos) << m;
    EXPECT_EQ(e.exit_code(), 2);
  }
}

}  // namespace
}  // namespace mt::train

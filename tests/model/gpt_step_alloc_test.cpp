// Every heap allocation of the model's steady-state step (forward, backward, and the next
// step's zeroing of the gradients), counted at the C library (tests/alloc_count.h): malloc,
// operator new, oneDNN's and OpenMP's. What it proves (docs/architecture.md): the step keeps
// nothing (every block allocated in it is freed before it ends), allocates the same number
// of blocks every step (no growth, no cache miss: a missed oneDNN primitive costs hundreds),
// and the accounting allocator sees nothing after step 1. Not zero: oneDNN 2.6 allocates a
// few small blocks inside every primitive execute (tests/kernels/mixed_test.cpp).
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "alloc_count.h"
#include "core/memory.h"
#include "core/philox.h"
#include "kernels/kernels.h"
#include "model/gpt.h"

namespace mt::model {
namespace {

void check_steady_state(bool bf16, const char* model = "tiny") {
  if (!test::kAllocCounting) GTEST_SKIP() << "a sanitizer build counts no allocations";
  kernels::set_threads(1);
  mem::Tracker tracker;
  mem::ScopedTracker scope(tracker);
  GptConfig c = preset(model);
  c.n_layer = 2;
  c.seq_len = 64;
  StoreOptions store;
  store.bf16_copy = bf16;
  Gpt gpt(c, 42, store);
  const int64_t B = 2, T = 64, N = B * T;
  std::vector<int32_t> in(N), tgt(N);
  for (int64_t i = 0; i < N; ++i) {
    in[i] = static_cast<int32_t>(rng::uniform(1, 1, i) * c.vocab);
    tgt[i] = static_cast<int32_t>(rng::uniform(1, 2, i) * c.vocab);
  }
  Activations a = gpt.make_activations(B, T);
  auto step = [&] {
    gpt.params().zero_grads();
    gpt.forward(a, in.data(), tgt.data());
    gpt.backward(a, 1.0f / static_cast<float>(N));
  };
  step();  // builds and caches the oneDNN primitives
  step();
  const int64_t tracked = tracker.snapshot().allocations;
  std::vector<int64_t> counts, live;
  counts.reserve(3);  // (the test's own bookkeeping allocates nothing while it counts)
  live.reserve(3);
  for (int k = 0; k < 3; ++k) {
    const test::AllocMark mark;
    step();
    const int64_t n = mark.allocations_since(), l = mark.live_since();
    counts.push_back(n);
    live.push_back(l);
    EXPECT_EQ(l, 0) << "step " << k + 3 << ": a block outlives the step";
  }
  EXPECT_GT(counts[0], 0) << "the counting hook counts nothing: it is not installed";
  EXPECT_EQ(counts[1], counts[0]) << "the step allocates more each time";
  EXPECT_EQ(counts[2], counts[0]) << "the step allocates more each time";
  EXPECT_EQ(tracker.snapshot().allocations, tracked) << "tracked allocations after step 2";
  std::printf("%s model step (%s, 2 layers, 128 tokens): %lld heap allocations, all freed\n",
              bf16 ? "bf16" : "f32", model, static_cast<long long>(counts[0]));
}

TEST(GptStepAllocations, SteadyStateKeepsNothingAndAllocatesTheSameEveryStep) {
  check_steady_state(false);
}

TEST(GptStepAllocations, Bf16SteadyStateKeepsNothingAndAllocatesTheSameEveryStep) {
  check_steady_state(true);
}

// Mixture of experts (mixtral-tiny's router, 8 experts, top 2, dropless): the routing, the
// sort by expert and the balancing losses' backward keep nothing either.
TEST(GptStepAllocations, MoeSteadyStateKeepsNothingAndAllocatesTheSameEveryStep) {
  check_steady_state(false, "mixtral-tiny");
}

}  // namespace
}  // namespace mt::model

// The bytes between sites of a streaming DiLoCo run (docs/diloco.md "Bytes between sites"),
// derived from the fragments' sizes, the outer steps each fragment takes and the encoding,
// equal the flight recorder's count exactly: blocking in every encoding, and overlapped
// (--outer-delay) on a simulated link with an evaluation while exchanges are in flight.
#include <gtest/gtest.h>

#include <map>
#include <mutex>

#include "test_util.h"
#include "tiny_run.h"
#include "train/trainer.h"

namespace mt::train {
namespace {

const std::string& data() {
  static const std::string p = test::demo_tokens(test::scratch_dir("diloco_bytes"));
  return p;
}

// 2 sites of one rank, 2 fragments, H = 4, 10 steps, validation after every second step.
TrainOptions streaming(const std::string& compress, int64_t delay) {
  TrainOptions o = test::tiny_run(data(), 10, 32, 8);
  o.model.n_layer = 2;
  o.dp = 2;
  o.backend = "local";
  o.eval_every = 2;
  o.eval_batches = 8;
  o.outer.sites = 2;
  o.outer.every = 4;
  o.outer.fragments = 2;
  o.outer.compress = compress;
  o.outer.delay = delay;
  return o;
}

// Bytes received in all by the S ranks of one cross-site group for one outer step of a
// fragment of `elems` elements of the rank's shard: an f32 all-reduce, 2 (S - 1) elems x 4;
// compressed, an all-to-all and an all-gather of S chunks of c elements encoded in w words,
// 2 (S - 1) x S x w x 4, c = ceil(elems / S) rounded up to 128 (train/outer_compress.h).
double exchange_bytes(int S, int64_t elems, const std::string& compress) {
  if (compress == "none") return 2.0 * (S - 1) * static_cast<double>(elems) * 4;
  int64_t c = (elems + S - 1) / S;
  c = (c + 127) / 128 * 128;
  const int64_t w = compress == "bf16" ? c / 2 : c / 128 + c / 4;
  return 2.0 * (S - 1) * S * static_cast<double>(w) * 4;
}

// Outer steps of fragment p in a run of N steps (no warm-up): one after each inner step
// (p + 1) H / F + k H < N, and every fragment's final one after step N.
int64_t outer_steps(int p, int64_t H, int F, int64_t N) {
  int64_t k = 0;
  for (int64_t t = (p + 1) * H / F; t < N; t += H) ++k;
  return k + 1;
}

TEST(DilocoBytes, StreamingRunsCountTheFragmentsBytesExactly) {
  struct Run {
    std::string compress;
    int64_t delay;
  };
  for (const Run& run : {Run{"none", 0}, Run{"bf16", 0}, Run{"int8", 0}, Run{"none", 2}}) {
    TrainOptions o = streaming(run.compress, run.delay);
    const std::string what = run.compress + " delay " + std::to_string(run.delay);
    if (run.delay > 0) {
      // A link of 2 hops x 0.25 ms per all-reduce plus its bytes at 10 Gbit/s (under 1 ms in
      // all): an exchange started just before a validation (after steps 2, 4, 6 and 8) lands on
      // the group's progress thread while the validation's 8 batches run.
      o.sim_link_mbit = 1e4;
      o.sim_link_ms = 0.25;
    }
    std::mutex mu;
    std::map<int, int64_t> fragment_elems;  // the fragments' elements, from the outer steps
    o.outer.observer = [&](const OuterStepView& v) {
      std::lock_guard lock(mu);
      int64_t n = 0;
      for (const auto& [a, b] : *v.ranges) n += b - a;
      fragment_elems[v.fragment] = n;
    };
    const TrainResult r = run_training(o);
    ASSERT_EQ(fragment_elems.size(), 2u) << what;
    EXPECT_EQ(fragment_elems[0] + fragment_elems[1], r.padded_params) << what;
    const int S = 2;
    double want = 0;
    std::vector<double> frag_bytes;
    for (int p = 0; p < 2; ++p) {
      frag_bytes.push_back(exchange_bytes(S, fragment_elems[p], run.compress));
      want += static_cast<double>(outer_steps(p, o.outer.every, o.outer.fragments, o.steps)) *
              frag_bytes.back();
    }
    double counted = 0;
    for (const StepRecord& s : r.steps) counted += s.outer_bytes;
    EXPECT_EQ(counted, want) << what;
    if (run.delay == 0) {  // blocking: each step's bytes those of the fragments it stepped
      const std::vector<double> per_step = {0, frag_bytes[0],
                                            0, frag_bytes[1],
                                            0, frag_bytes[0],
                                            0, frag_bytes[1],
                                            0, frag_bytes[0] + frag_bytes[1]};
      ASSERT_EQ(r.steps.size(), per_step.size());
      for (size_t i = 0; i < per_step.size(); ++i)
        EXPECT_EQ(r.steps[i].outer_bytes, per_step[i]) << what << " step " << i + 1;
    }
  }
}

}  // namespace
}  // namespace mt::train

// Overlap: gradient reductions start while backward is still running. The flight recorder
// timestamps every op (queued, started, done); we compare them with the moment the last
// unit's (the embeddings') backward begins.
#include <gtest/gtest.h>

#include "comm/launch.h"
#include "core/clock.h"
#include "model/gpt.h"
#include "parallel/data.h"
#include "parallel/zero.h"

namespace mt::parallel {
namespace {

FlatLayout layout_of(const model::Gpt& gpt) {
  FlatLayout l;
  for (const auto& p : gpt.params().params()) l.param_offsets.push_back(p.offset_elems);
  l.param_offsets.push_back(gpt.params().numel());
  l.unit_first_param = gpt.unit_first_params();
  l.padded_elems = gpt.params().padded_numel();
  return l;
}

// Forwards to the reducer and notes when unit 0's backward begins.
struct Timed : UnitHooks {
  UnitHooks* inner = nullptr;
  double unit0_backward_s = 0;
  void before_forward(int u) override { inner->before_forward(u); }
  void before_backward(int u) override {
    if (u == 0) unit0_backward_s = now_s();
    inner->before_backward(u);
  }
  void after_backward(int u) override { inner->after_backward(u); }
};

void check_overlap(int zero) {
  comm::LaunchOptions lo;
  lo.backend = comm::BackendKind::kLocal;
  lo.world_size = 2;
  comm::launch(lo, [&](comm::Group& world) {
    mem::Tracker tracker;
    mem::ScopedTracker scope(tracker);
    model::GptConfig c = model::preset("tiny");
    c.seq_len = 64;
    const int B = 4, T = 64;
    model::Gpt gpt(c, 1337, model::StoreOptions{world.size(), true, zero == 0});
    const FlatLayout layout = layout_of(gpt);
    std::unique_ptr<BucketReducer> buckets;
    std::unique_ptr<ShardedGrads> grads;
    Timed timed;
    if (zero == 0) {
      buckets = std::make_unique<BucketReducer>(world, layout, gpt.params().flat_grads(),
                                                BucketReducer::Mode::kAllReduce, 1 << 16);
      buckets->set_enabled(true);
      timed.inner = buckets.get();
    } else {
      grads = std::make_unique<ShardedGrads>(world, layout);
      for (int u = 0; u < layout.num_units(); ++u)
        gpt.params().bind_grads(layout.unit_first_param[u], layout.unit_first_param[u + 1],
                                grads->unit_grads(u));
      timed.inner = grads.get();
    }
    gpt.set_hooks(&timed);
    model::Activations a = gpt.make_activations(B, T);
    std::vector<int32_t> in(B * T), tgt(B * T);
    for (int i = 0; i < B * T; ++i) {
      in[i] = (i * 7 + world.rank()) % 256;
      tgt[i] = (i * 11) % 256;
    }
    gpt.forward(a, in.data(), tgt.data());
    gpt.backward(a, 1.0f / (B * T));
    const double backward_end_s = now_s();
    if (buckets) buckets->finish();
    if (grads) grads->finish();

    const comm::OpType op = zero == 0 ? comm::OpType::kAllReduce : comm::OpType::kReduceScatter;
    std::vector<comm::OpRecord> ops;
    for (const auto& r : world.recorder().last(256))
      if (r.op == op && r.group == world.name()) ops.push_back(r);
    ASSERT_GE(ops.size(), 3u);
    // The first reduction (the head / last block's gradients) was queued and started
    // before the embeddings' backward began, i.e. while backward was still running.
    EXPECT_LT(ops.front().queued_s, timed.unit0_backward_s);
    EXPECT_LT(ops.front().started_s, timed.unit0_backward_s);
    int started_early = 0;
    for (const auto& r : ops) started_early += r.started_s < backward_end_s;
    // Later ones may queue behind it (one progress thread per group runs them in order,
    // each waiting for the peer); at least the first is fully inside backward.
    EXPECT_GE(started_early, 1);
    if (world.rank() == 0)
      std::printf(
          "zero %d: %zu reductions, %d started before backward ended; first started "
          "%.2f ms before the embeddings' backward\n",
          zero, ops.size(), started_early, 1e3 * (timed.unit0_backward_s - ops.front().started_s));
  });
}

TEST(DpOverlap, DdpBucketsAllReduceDuringBackward) { check_overlap(0); }
TEST(DpOverlap, Zero2UnitsReduceScatterDuringBackward) { check_overlap(2); }

}  // namespace
}  // namespace mt::parallel

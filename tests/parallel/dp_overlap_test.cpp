// Overlap: gradient reductions run while backward is still running. Before the last unit's
// (the embeddings') backward begins, the rank waits, with a deadline, for the first
// reduction to complete: a reducer that communicated only in finish() never completes one
// there and the test fails. Nothing here depends on how the threads happen to be scheduled
// (the old timestamp comparison did, and flaked under load).
#include <gtest/gtest.h>

#include <thread>

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

// Forwards to the reducer; before unit 0's backward, waits for the first reduction of kind
// `op` on `group` to complete.
struct WaitInBackward : UnitHooks {
  UnitHooks* inner = nullptr;
  comm::Group* group = nullptr;
  comm::OpType op = comm::OpType::kAllReduce;
  double deadline_s = 120;  // generous: 2 cores shared with the rest of the suite
  bool completed_inside_backward = false;
  double unit0_backward_s = 0;
  void before_forward(int u) override { inner->before_forward(u); }
  void before_backward(int u) override {
    if (u == 0) {
      const double give_up_s = now_s() + deadline_s;
      while (!(completed_inside_backward = first_done()) && now_s() < give_up_s)
        std::this_thread::yield();
      unit0_backward_s = now_s();
    }
    inner->before_backward(u);
  }
  void after_backward(int u) override { inner->after_backward(u); }
  bool first_done() const {
    for (const auto& r : group->recorder().last(256))
      if (r.op == op && r.group == group->name()) return r.state == comm::OpState::kDone;
    return false;
  }
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
    WaitInBackward timed;
    timed.group = &world;
    timed.op = zero == 0 ? comm::OpType::kAllReduce : comm::OpType::kReduceScatter;
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

    std::vector<comm::OpRecord> ops;
    for (const auto& r : world.recorder().last(256))
      if (r.op == timed.op && r.group == world.name()) ops.push_back(r);
    ASSERT_GE(ops.size(), 3u);
    // The first reduction (the head / last block's gradients) was queued by backward and
    // completed while backward was paused before its last unit.
    EXPECT_TRUE(timed.completed_inside_backward)
        << "no reduction completed within " << timed.deadline_s
        << " s while backward waited before the embeddings: reductions do not overlap backward";
    EXPECT_LT(ops.front().queued_s, timed.unit0_backward_s);
    // Every later reduction was queued during backward, before finish() was called.
    for (const auto& r : ops) EXPECT_LE(r.queued_s, backward_end_s) << describe(r);
    if (world.rank() == 0)
      std::printf("zero %d: %zu reductions, the first done inside backward\n", zero, ops.size());
  });
}

TEST(DpOverlap, DdpBucketsAllReduceDuringBackward) { check_overlap(0); }
TEST(DpOverlap, Zero2UnitsReduceScatterDuringBackward) { check_overlap(2); }

}  // namespace
}  // namespace mt::parallel

// Volume: the bytes the cp group moves in a training step, counted by the flight recorder
// as their own dimension (StepRecord::cp_bytes, the metrics' cp_bytes), equal the formula of
// docs/context_parallel.md exactly. One K|V block is a rank's rows of one microbatch,
// blk = B·(T/N)·2·(kv_heads/tp)·hd floats; per layer and microbatch a rank receives
//   ring:       forward N−1 blocks (the others' K|V), backward N−1 K|V + N dK|dV blocks
//               (the last hop takes each gradient home): (3N − 2)·blk
//   all-gather: one all-gather forward, one all-gather + one reduce-scatter backward, each
//               (N−1)/N of the N blocks (docs/comm.md): 3(N − 1)·blk
// and recomputation (selective or full) runs the attention's forward once more in backward:
// + (N − 1)·blk.
// a2a (Ulysses), with H and KV the query and kv heads per tp rank: every all-to-all delivers
// (N − 1)/N of a rank's rows for its head group: forward q|k|v (H + 2KV) and the outputs (H),
// backward q|k|v again, the outputs and their gradients (2H) and dq|dk|dv (H + 2KV):
//   (N − 1)/N · B·(T/N)·hd · (6H + 6KV, + 2H + 2KV with recomputation).
#include <gtest/gtest.h>

#include "test_util.h"
#include "tiny_run.h"

namespace mt::train {
namespace {

const std::string& data() {
  static const std::string path = test::demo_tokens(test::scratch_dir("cp_volume"));
  return path;
}

void check(TrainOptions o) {
  const TrainResult r = run_training(o);
  const int64_t n = o.cp, L = o.model.n_layer, mb = o.microbatch_size();
  const int64_t micro = o.microbatches_per_step();
  const int64_t blk =
      mb * (o.model.seq_len / n) * 2 * (o.model.kv_heads() / o.tp) * o.model.head_dim();
  const int64_t blocks =
      (o.cp_comm == "ring" ? 3 * n - 2 : 3 * (n - 1)) + (o.recompute != "none" ? n - 1 : 0);
  int64_t per_rank = L * micro * blocks * blk * 4;
  if (o.cp_comm == "a2a") {
    const int64_t H = o.model.n_head / o.tp, KV = o.model.kv_heads() / o.tp;
    const int64_t heads = 6 * (H + KV) + (o.recompute != "none" ? 2 * (H + KV) : 0);
    per_rank =
        L * micro * (n - 1) * mb * (o.model.seq_len / n) * o.model.head_dim() * heads / n * 4;
  }
  ASSERT_EQ(r.ranks.size(), static_cast<size_t>(o.world_size()));
  for (const RankRecord& rank : r.ranks) {
    ASSERT_EQ(rank.step_cp_recv_bytes.size(), static_cast<size_t>(o.steps));
    for (int64_t b : rank.step_cp_recv_bytes) EXPECT_EQ(b, per_rank) << "rank " << rank.rank;
  }
  for (const StepRecord& s : r.steps)
    EXPECT_EQ(s.cp_bytes, static_cast<double>(per_rank * o.world_size()));
  std::printf("cp %lld %s %s: %lld bytes per rank and step\n", static_cast<long long>(n),
              o.cp_comm.c_str(), o.model.name.c_str(), static_cast<long long>(per_rank));
}

TEST(CpVolume, RingAndAllGatherMoveTheirBlocks) {
  for (const char* comm : {"ring", "all-gather", "a2a"})
    for (int cp : {2, 4}) {
      TrainOptions o = test::tiny_run(data(), 2, 32, 4);
      o.model.n_layer = 2;
      o.backend = "local";
      o.cp = cp;
      o.cp_comm = comm;
      check(o);
    }
}

TEST(CpVolume, GroupedQueryHeadsTravelUnrepeatedAndSplitOverTp) {
  for (const char* comm : {"ring", "all-gather", "a2a"}) {
    TrainOptions o = test::tiny_run(data(), 2, 32, 4);
    o.cp_comm = comm;
    o.model = model::preset("llama-tiny");  // 4 query heads sharing 2 kv heads
    o.model.n_layer = 2;
    o.model.seq_len = 32;
    o.backend = "local";
    o.cp = 2;
    // a2a splits the tp rank's kv heads over cp: 2 kv heads take tp 1 (tp 2 leaves 1).
    o.tp = o.cp_comm == "a2a" ? 1 : 2;
    o.sp = o.tp > 1;
    o.microbatch = 2;  // two microbatches per step
    check(o);
  }
}

TEST(CpVolume, RecomputationGathersOnceMore) {
  for (const char* rc : {"selective", "full"}) {
    TrainOptions o = test::tiny_run(data(), 2, 32, 4);
    o.cp_comm = rc[0] == 's' ? "ring" : "all-gather";
    o.model.n_layer = 2;
    o.backend = "local";
    o.cp = 2;
    o.recompute = rc;
    check(o);
    o.cp_comm = "a2a";
    check(o);
  }
}

}  // namespace
}  // namespace mt::train

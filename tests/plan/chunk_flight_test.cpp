// What a pipeline rank holds chunk by chunk (plan/pipeline.h chunk_flight) and the activation
// memory the planner takes from it for Megatron-style allocation (plan/memory.cpp): a
// microbatch-chunk in flight keeps its own chunk's layers, not the rank's largest chunk's,
// which is what makes Llama 3's lighter ends (a first chunk of the embedding alone) lighter.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "plan/pipeline.h"
#include "plan/planner.h"

namespace mt::plan {
namespace {

// `meshtrain schedule --pp 2 --microbatches 4 --schedule interleaved --virtual-stages 2`:
//   rank 0: F0.0 F1.0 F0.2 F1.2 F2.0 B0.2 F3.0 B1.2 F2.2 B0.0 F3.2 B1.0 B2.2 B3.2 B2.0 B3.0
//   rank 1: F0.1 F1.1 F0.3 B0.3 F1.3 B1.3 F2.1 B0.1 F3.1 B1.1 F2.3 B2.3 F3.3 B3.3 B2.1 B3.1
// Held by local chunk (chunk / pp) just before each backward that follows a forward:
//   rank 0: [3, 2] (before B0.2), [4, 1] (B1.2), [4, 1] (B0.0), [3, 2] (B1.0)
//   rank 1: [2, 1] (B0.3, B1.3, B2.3, B3.3), [3, 0] (B0.1, B1.1)
TEST(ChunkFlight, PeaksByChunkOfTheInterleavedSchedule) {
  const PipeSchedule s = make_schedule("interleaved", 2, 2, 4);
  const ChunkFlight f = chunk_flight(s);
  ASSERT_EQ(f.peaks.size(), 2u);
  using Peaks = std::set<std::vector<int>>;
  EXPECT_EQ(Peaks(f.peaks[0].begin(), f.peaks[0].end()), (Peaks{{3, 2}, {4, 1}}));
  EXPECT_EQ(Peaks(f.peaks[1].begin(), f.peaks[1].end()), (Peaks{{2, 1}, {3, 0}}));
  // The count alone is the largest sum: what max_in_flight says.
  EXPECT_EQ(max_in_flight(s, false), (std::vector<int>{5, 3}));
  // Weighted: rank 0 with chunk 0 empty and chunk 2 of two layers holds 2·2 at most.
  EXPECT_EQ(peak_bytes_in_flight(f, 0, {0.0, 2.0}), 4.0);
  EXPECT_EQ(peak_bytes_in_flight(f, 0, {1.0, 0.0}), 4.0);
  EXPECT_EQ(peak_bytes_in_flight(f, 1, {1.0, 1.0}), 3.0);
}

// A Llama-shaped job (no dropout, bf16, flash attention) on two pipeline ranks, two chunks
// each, four microbatches; tp 1, so the embedding's output is e = 2·s·b·h bytes.
Job llama_pp2_job() {
  Job j;
  j.model = model_preset("llama3-8b");
  j.model.n_layer = 6;
  j.seq = j.model.seq = 1024;
  j.cluster = cluster_preset("dgx-h100");
  j.gpus = 2;
  j.batch = 4;
  j.dtype = "bf16";
  return j;
}

Layout pp2_layout(std::vector<int> split) {
  Layout l;
  l.tp = 1, l.pp = 2, l.dp = 1, l.microbatch = 1, l.zero = 1;
  l.virtual_stages = 2;
  l.schedule = "interleaved";
  l.recompute = Recompute::kNone;
  l.pp_layers = std::move(split);
  return l;
}

TEST(ChunkFlight, RankZeroActivationsCountEachChunksOwnLayers) {
  const Job j = llama_pp2_job();
  // Chunks 0..3 in model order; rank 0 has chunks 0 and 2, rank 1 chunks 1 and 3.
  // Split {0, 2, 2, 2}: rank 0 holds [3, 2] or [4, 1] of (0 layers, 2 layers): 4 layers' sets.
  const Layout empty_first = pp2_layout({0, 2, 2, 2});
  ASSERT_FALSE(invalid_reason(j, empty_first).has_value());
  const double A = memory_by_stage(j, empty_first)[0].activations / 4;  // one layer, one microbatch
  ASSERT_GT(A, 0);
  // Split {1, 2, 2, 1}: chunk 0 has a layer and the embedding's output e:
  //   [3, 2]: 3·(A + e) + 2·2A = 7A + 3e;  [4, 1]: 4·(A + e) + 2A = 6A + 4e.
  // With e < A the first is the peak. Counting every chunk as the rank's largest (2 layers)
  // would say 5·2A + 5e = 10A + 5e: the defect this guards.
  const double e = 2.0 * double(j.seq) * 1 * double(j.model.d_model);
  ASSERT_LT(e, A);
  const Layout one_first = pp2_layout({1, 2, 2, 1});
  ASSERT_FALSE(invalid_reason(j, one_first).has_value());
  const double got = memory_by_stage(j, one_first)[0].activations;
  // Both sides are sums of a few products of integers and powers of two of doubles: exact to
  // rounding, 1e-12 relative.
  EXPECT_NEAR(got, 7 * A + 3 * e, 1e-12 * got);
  EXPECT_LT(got, 10 * A + 5 * e - A);
}

// The search (which caches the chunk profile per schedule, shared by every split of that
// schedule) and the estimate see the same memory: Meta's 8K layout on 16,384 GPUs (Llama 3
// 405B, 126 layers, the first chunk the embedding alone and the last the head alone, v 8),
// on GPUs with room for it (141 GB, so that the search keeps it rather than dropping it).
TEST(ChunkFlight, SearchAndEstimateAgreeOnLighterEnds) {
  Job j;
  j.model = model_preset("llama3-405b");
  j.cluster = cluster_preset("dgx-h100");
  j.cluster.gpu.hbm_bytes = 141e9;
  j.gpus = 16384;
  j.batch = 2048;
  j.seq = j.model.seq = 8192;
  j.dtype = "bf16";
  SearchPins pins;
  pins.tp = 8, pins.pp = 16, pins.dp = 128, pins.virtual_stages = 8, pins.microbatch = 1;
  pins.zero = 1, pins.sp = true, pins.recompute = Recompute::kNone;
  pins.schedule = "interleaved";
  pins.pp_layers.assign(128, 1);
  pins.pp_layers.front() = pins.pp_layers.back() = 0;
  const SearchResult r = search(j, pins, 1);
  ASSERT_EQ(r.top.size(), 1u);
  const Layout& l = r.top[0].layout;
  ASSERT_EQ(l.pp_layers, pins.pp_layers);
  int worst = -1;
  const MemoryBytes m = memory_per_gpu(j, l, &worst);
  EXPECT_EQ(r.top[0].memory.total(), m.total());
  EXPECT_EQ(r.top[0].memory.activations, m.activations);
  // Rank 0's first chunk holds no layer: its 128 microbatch-chunks in flight keep fewer
  // layers' sets than rank 1's, all of whose chunks have a layer.
  const std::vector<MemoryBytes> stages = memory_by_stage(j, l);
  EXPECT_LT(stages[0].activations, stages[1].activations);
  EXPECT_NE(worst, 0);
}

}  // namespace
}  // namespace mt::plan

// Volume: the bytes the tp group moves in one microbatch's forward and backward, counted by
// the flight recorder, equal the formula of docs/tensor_parallel.md exactly.
//   without --sp: all_reduce of N·C floats: 1 (embedding) + 2 per layer forward, 1 (LM-head
//                 input) + 2 per layer backward; plus the cross-entropy's all-reduces of N
//                 (max) and 2N (sum-exp, target logit) floats.
//   with --sp:    reduce_scatter of N·C: 1 + 2 per layer forward, 1 + 2 per layer backward;
//                 all_gather of N·C: 1 (LM-head input) + 2 per layer forward, 1 (embedding
//                 gradient) + 4 per layer backward (2 output gradients + the 2 layer-norm
//                 outputs gathered again instead of stored); the same 2 small all-reduces.
// Per collective of S bytes, each rank receives 2(t-1)/t·S (all_reduce) or (t-1)/t·S
// (all_gather, reduce_scatter) (docs/comm.md).
#include <gtest/gtest.h>

#include <vector>

#include "comm/launch.h"
#include "comm/mesh.h"
#include "kernels/kernels.h"
#include "model/gpt.h"

namespace mt::model {
namespace {

struct Counts {
  comm::ByteCount ar, ag, rs;
};

Counts run_one_microbatch(int t, bool sp, int64_t L, int64_t B, int64_t T) {
  GptConfig c = preset("tiny");
  c.n_layer = L;
  c.seq_len = T;
  std::vector<Counts> out(static_cast<size_t>(t));
  comm::LaunchOptions lo;
  lo.backend = comm::BackendKind::kLocal;
  lo.world_size = t;
  comm::launch(lo, [&](comm::Group& world) {
    kernels::set_threads(1);
    comm::DeviceMesh mesh(world, comm::MeshShape({{"tp", t}}, world.size()));
    comm::Group& tp = mesh.group("tp");
    Gpt gpt(c, 1337, {}, parallel::tp::TpContext::of(tp, sp));
    Activations a = gpt.make_activations(B, T);
    std::vector<int32_t> in(static_cast<size_t>(B * T)), tgt(in.size());
    for (size_t i = 0; i < in.size(); ++i) {
      in[i] = static_cast<int32_t>((7 * i + 3) % 256);
      tgt[i] = static_cast<int32_t>((5 * i + 1) % 256);
    }
    tp.recorder().reset_counters();
    gpt.forward(a, in.data(), tgt.data());
    gpt.backward(a, 1.0f / static_cast<float>(B * T));
    Counts& k = out[static_cast<size_t>(world.rank())];
    k.ar = tp.recorder().bytes(tp.name(), comm::OpType::kAllReduce);
    k.ag = tp.recorder().bytes(tp.name(), comm::OpType::kAllGather);
    k.rs = tp.recorder().bytes(tp.name(), comm::OpType::kReduceScatter);
  });
  for (int r = 1; r < t; ++r) {
    EXPECT_EQ(out[r].ar.recv_bytes, out[0].ar.recv_bytes);
    EXPECT_EQ(out[r].ag.recv_bytes, out[0].ag.recv_bytes);
    EXPECT_EQ(out[r].rs.recv_bytes, out[0].rs.recv_bytes);
  }
  return out[0];
}

TEST(TpVolume, WithoutSequenceParallelismTwoAllReducesPerBlockEachWay) {
  const int64_t L = 2, B = 2, T = 32, C = preset("tiny").d_model, N = B * T;
  for (int t : {2, 4}) {
    const Counts k = run_one_microbatch(t, false, L, B, T);
    const int64_t nc_bytes = N * C * 4;
    EXPECT_EQ(k.ar.ops, (1 + 2 * L) + (1 + 2 * L) + 2) << "t " << t;
    const int64_t s_bytes = (2 + 4 * L) * nc_bytes + 3 * N * 4;
    EXPECT_EQ(k.ar.recv_bytes, 2 * (t - 1) * s_bytes / t) << "t " << t;
    EXPECT_EQ(k.ar.sent_bytes, k.ar.recv_bytes);
    EXPECT_EQ(k.ag.ops, 0);
    EXPECT_EQ(k.rs.ops, 0);
  }
}

TEST(TpVolume, WithSequenceParallelismAllGathersAndReduceScatters) {
  const int64_t L = 2, B = 2, T = 32, C = preset("tiny").d_model, N = B * T;
  for (int t : {2, 4}) {
    const Counts k = run_one_microbatch(t, true, L, B, T);
    const int64_t nc_bytes = N * C * 4;
    EXPECT_EQ(k.rs.ops, (1 + 2 * L) + (1 + 2 * L)) << "t " << t;
    EXPECT_EQ(k.ag.ops, (1 + 2 * L) + (1 + 4 * L)) << "t " << t;
    EXPECT_EQ(k.rs.recv_bytes, (t - 1) * k.rs.ops * nc_bytes / t);
    EXPECT_EQ(k.ag.recv_bytes, (t - 1) * k.ag.ops * nc_bytes / t);
    EXPECT_EQ(k.ar.ops, 2);  // the cross-entropy's max and (sum-exp, target logit)
    EXPECT_EQ(k.ar.recv_bytes, 2 * (t - 1) * (3 * N * 4) / t);
    // Per block forward: 2 all-gathers + 2 reduce-scatters move what 2 all-reduces move.
    EXPECT_EQ(2 * (t - 1) * nc_bytes / t + 2 * (t - 1) * nc_bytes / t,
              2 * (2 * (t - 1) * nc_bytes / t));
  }
}

}  // namespace
}  // namespace mt::model

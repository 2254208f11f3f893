// Expert parallelism's token exchange (parallel/expert.h): rows reach the rank of their
// expert grouped by local expert and come back where they were, whatever the counts (an
// expert nobody routes to, a rank that routes nothing at all); and in a model, the ep
// group's bytes are exactly the routed rows times the width, plus the counts. --moe-shadow:
// which experts it shadows, and that a shadowed layer gives the exchange's numbers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <vector>

#include "comm/launch.h"
#include "comm/mesh.h"
#include "kernels/kernels.h"
#include "model/gpt.h"
#include "parallel/expert.h"

namespace mt::parallel::ep {
namespace {

void run_local(int n, const std::function<void(comm::Group&)>& fn) {
  comm::LaunchOptions o;
  o.backend = comm::BackendKind::kLocal;
  o.world_size = n;
  o.timeout_s = 60;
  comm::launch(o, fn);
}

// Rows per global expert routed by rank r: rank 0 routes nothing at all; expert 1 gets no
// row from anyone; the rest an uneven pattern.
std::vector<int64_t> counts_of(int r, int64_t E) {
  std::vector<int64_t> c(static_cast<size_t>(E), 0);
  if (r == 0) return c;
  for (int64_t e = 0; e < E; ++e) c[static_cast<size_t>(e)] = e == 1 ? 0 : (3 * r + 5 * e) % 4;
  return c;
}

// The value of column i of the j-th row that rank s routes to expert e.
float value(int s, int64_t e, int64_t j, int64_t i) {
  return static_cast<float>(s * 100000 + e * 1000 + j * 10 + i);
}

class EpExchange : public ::testing::TestWithParam<int> {};

TEST_P(EpExchange, RowsReachTheirExpertGroupedAndComeBackWhereTheyWere) {
  const int n = GetParam();
  const int64_t E = 2 * n, W = 3;
  run_local(n, [&](comm::Group& g) {
    const EpContext ep = EpContext::of(g);
    const int me = g.rank();
    const std::vector<int64_t> counts = counts_of(me, E);
    std::vector<float> rows;  // this rank's rows, expert-sorted, as route() orders them
    for (int64_t e = 0; e < E; ++e)
      for (int64_t j = 0; j < counts[static_cast<size_t>(e)]; ++j)
        for (int64_t i = 0; i < W; ++i) rows.push_back(value(me, e, j, i));
    const Exchange x = plan_exchange(ep, counts, E);
    const int64_t R = max_received_rows(n, 4, 2, E, 0);
    ASSERT_LE(x.received, R);
    std::vector<float> src_major(static_cast<size_t>(R * W), -1.f), expert_major(src_major);
    exchange_rows(ep, x, rows.data(), src_major.data(), W, false);
    to_expert_major(x, src_major.data(), expert_major.data(), W);
    // Expected: for each local expert, every source's rows in source order.
    std::vector<float> expect;
    for (int64_t le = 0; le < E / n; ++le) {
      const int64_t e = me * (E / n) + le;
      int64_t rows_of_e = 0;
      for (int s = 0; s < n; ++s) {
        const int64_t c = counts_of(s, E)[static_cast<size_t>(e)];
        rows_of_e += c;
        for (int64_t j = 0; j < c; ++j)
          for (int64_t i = 0; i < W; ++i) expect.push_back(value(s, e, j, i));
      }
      EXPECT_EQ(x.expert_rows[static_cast<size_t>(le)], rows_of_e) << "expert " << e;
    }
    ASSERT_EQ(x.received * W, static_cast<int64_t>(expect.size()));
    EXPECT_EQ(std::vector<float>(expert_major.begin(), expert_major.begin() + x.received * W),
              expect)
        << "rank " << me;
    // And back: the combine returns every row to its place.
    std::vector<float> back(rows.size() + 1, -7.f);  // one canary past the end
    to_source_major(x, expert_major.data(), src_major.data(), W);
    exchange_rows(ep, x, src_major.data(), back.data(), W, true);
    EXPECT_EQ(std::vector<float>(back.begin(), back.end() - 1), rows) << "rank " << me;
    EXPECT_EQ(back.back(), -7.f) << "the combine wrote past this rank's rows";
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, EpExchange, ::testing::Values(1, 2, 3, 4));

// One microbatch's forward and backward of an MoE model over ep ranks: the ep group's bytes
// are, per MoE layer, the per-expert counts (E/ep i32 to each other rank) and four exchanges
// of rows (dispatch, combine, and their gradients), each row d_model f32, to and from the
// other ranks: the rows counted from the routing (route()'s kept counts of every rank).
TEST(EpVolume, BytesAreTheRoutedRowsTimesTheWidthExactly) {
  for (const int n : {2, 4}) {
    model::GptConfig c = model::preset("mixtral-tiny");
    c.n_layer = 2;
    c.seq_len = 16;
    const int64_t B = 2, T = 16, E = c.moe.n_experts, El = E / n, C = c.d_model;
    std::vector<std::vector<std::vector<int64_t>>> kept(static_cast<size_t>(n));  // [r][l][E]
    std::vector<comm::ByteCount> bytes(static_cast<size_t>(n));
    std::mutex mu;
    run_local(n, [&](comm::Group& world) {
      kernels::set_threads(1);
      comm::DeviceMesh mesh(world, comm::MeshShape({{"ep", n}}, world.size()));
      comm::Group& epg = mesh.group("ep");
      model::Gpt gpt(c, 1337, {}, {}, {}, EpContext::of(epg));
      model::Activations a = gpt.make_activations(B, T);
      std::vector<int32_t> in(static_cast<size_t>(B * T)), tgt(in.size());
      for (size_t i = 0; i < in.size(); ++i) {  // each rank its own tokens
        in[i] = static_cast<int32_t>((7 * i + 31 * world.rank() + 3) % 256);
        tgt[i] = static_cast<int32_t>((5 * i + 1) % 256);
      }
      epg.recorder().reset_counters();
      gpt.forward(a, in.data(), tgt.data());
      gpt.backward(a, 1.0f / static_cast<float>(B * T));
      std::lock_guard lock(mu);
      for (int l = 0; l < c.n_layer; ++l)
        kept[static_cast<size_t>(world.rank())].push_back(
            a.blocks[static_cast<size_t>(l)].moe.counts);
      bytes[static_cast<size_t>(world.rank())] =
          epg.recorder().bytes(epg.name(), comm::OpType::kAllToAll);
    });
    for (int me = 0; me < n; ++me) {
      int64_t sent = 0, recv = 0;
      for (int l = 0; l < c.n_layer; ++l) {
        sent += 4 * El * (n - 1);
        recv += 4 * El * (n - 1);
        for (int j = 0; j < n; ++j) {
          if (j == me) continue;
          int64_t to_j = 0, from_j = 0;  // rows me routes to j's experts, and j to mine
          for (int64_t e = 0; e < El; ++e) {
            to_j += kept[static_cast<size_t>(me)][static_cast<size_t>(l)]
                        [static_cast<size_t>(j * El + e)];
            from_j += kept[static_cast<size_t>(j)][static_cast<size_t>(l)]
                          [static_cast<size_t>(me * El + e)];
          }
          // Forward: dispatch sends to_j rows, the combine sends back from_j; backward the
          // same two again (output gradients out, input gradients back).
          sent += 2 * (to_j + from_j) * C * 4;
          recv += 2 * (to_j + from_j) * C * 4;
        }
      }
      EXPECT_EQ(bytes[static_cast<size_t>(me)].sent_bytes, sent) << "ep " << n << " rank " << me;
      EXPECT_EQ(bytes[static_cast<size_t>(me)].recv_bytes, recv) << "ep " << n << " rank " << me;
      EXPECT_EQ(bytes[static_cast<size_t>(me)].ops, c.n_layer * 5)
          << "counts + 4 exchanges a layer";
    }
  }
}

// --moe-shadow's choice (choose_shadows): rows per (source rank, expert), ep 2 with 4
// experts (rank 0 holds 0-1, rank 1 holds 2-3).
TEST(EpShadows, TheBusiestRanksExpertsWithTheMostForeignRowsUntilBalanced) {
  // Every row goes to rank 0's experts: rank 0 computes 400 rows, rank 1 none. Shadowing
  // expert 0 (100 rows from rank 1, against expert 1's 70) leaves 300 / 100, then expert 1:
  // 230 / 170.
  EXPECT_EQ(choose_shadows({100, 130, 0, 0, 100, 70, 0, 0}, 2, 4, 1.1),
            (std::vector<uint8_t>{1, 1, 0, 0}));
  // Rank 1 busy (360 rows against 30): its expert 3 has the most rows from rank 0 (150
  // against 20). Shadowed, it leaves 180 / 210, within 1.1 x the mean (195): done.
  EXPECT_EQ(choose_shadows({10, 10, 20, 150, 5, 5, 150, 40}, 2, 4, 1.1),
            (std::vector<uint8_t>{0, 0, 0, 1}));
  // At most E/ep = 1 expert per layer with ep 4 and 4 experts, however uneven.
  std::vector<int64_t> all(16, 0);
  for (int s = 0; s < 4; ++s) all[static_cast<size_t>(s * 4)] = 50;  // everyone to expert 0
  EXPECT_EQ(choose_shadows(all, 4, 4, 1.1), (std::vector<uint8_t>{1, 0, 0, 0}));
}

TEST(EpShadows, NoneWhenBalancedOrWhenItWouldNotLowerThePeak) {
  EXPECT_EQ(choose_shadows({50, 50, 50, 50, 50, 50, 50, 50}, 2, 4, 1.1),
            (std::vector<uint8_t>(4, 0)));
  // 105 against 95 rows: within 1.1 x the mean.
  const std::vector<int64_t> slight{60, 45, 45, 50, 0, 0, 0, 0};
  EXPECT_EQ(choose_shadows(slight, 2, 4, 1.1), (std::vector<uint8_t>(4, 0)));
  // Every row comes from rank 1 to rank 0's expert: shadowing it only moves the same 10 rows
  // to rank 1.
  EXPECT_EQ(choose_shadows({0, 0, 10, 0}, 2, 2, 1.0), (std::vector<uint8_t>(2, 0)));
  // Nobody routes anything.
  EXPECT_EQ(choose_shadows(std::vector<int64_t>(8, 0), 2, 4, 1.0), (std::vector<uint8_t>(4, 0)));
}

// One microbatch of mixtral-tiny (8 experts) over ep 2 with a zero router: every logit ties,
// so every token of both ranks picks experts 0 and 1, both rank 0's. With --moe-shadow both
// are shadowed (rank 0: 4n rows -> 3n -> 2n of 4n), no row travels, and each rank runs its
// own rows. What it must give: the unshadowed exchange's loss and gradients, every tensor on
// every rank (only the shadowed experts' weight gradients are summed in another order: two
// partial GEMMs added at the owner instead of one over both ranks' rows, a few ulps of the
// largest element; 1e-5 of it bounds that, and a gradient that never reached its owner is off
// by all of it); and, on the ep group, exactly: the counts (E i32 to the other rank), the two
// experts' weights once from rank 0 to rank 1 (each FC·C + C·F f32) and their gradients once
// back, no rows.
struct ShadowRun {
  std::vector<float> loss;                                     // [rank]
  std::vector<std::vector<float>> grads;                       // [rank] the flat gradients
  std::vector<std::map<comm::OpType, comm::ByteCount>> bytes;  // [rank]
  std::vector<int64_t> shadows;  // [rank] experts shadowed, summed over layers
};

ShadowRun run_zero_router(bool shadow) {
  model::GptConfig c = model::preset("mixtral-tiny");
  c.n_layer = 2;
  c.seq_len = 16;
  const int n = 2;
  const int64_t B = 2, T = 16;
  ShadowRun out;
  out.loss.resize(n);
  out.grads.resize(n);
  out.bytes.resize(n);
  out.shadows.resize(n);
  run_local(n, [&](comm::Group& world) {
    kernels::set_threads(1);
    comm::DeviceMesh mesh(world, comm::MeshShape({{"ep", n}}, world.size()));
    comm::Group& epg = mesh.group("ep");
    model::Gpt gpt(c, 1337, {}, {}, {}, EpContext::of(epg));
    model::MoeOptions mo;
    mo.shadow = shadow;
    gpt.set_moe_options(mo);
    for (model::Param& p : gpt.params().params())
      if (p.spec.name.find("moe.router.weight") != std::string::npos) p.value.zero_();
    model::Activations a = gpt.make_activations(B, T);
    std::vector<int32_t> in(static_cast<size_t>(B * T)), tgt(in.size());
    for (size_t i = 0; i < in.size(); ++i) {
      in[i] = static_cast<int32_t>((7 * i + 31 * world.rank() + 3) % 256);
      tgt[i] = static_cast<int32_t>((5 * i + 1) % 256);
    }
    gpt.params().zero_grads();
    epg.recorder().reset_counters();
    const float loss = gpt.forward(a, in.data(), tgt.data());
    gpt.backward(a, 1.0f / static_cast<float>(B * T));
    const int r = world.rank();
    out.loss[static_cast<size_t>(r)] = loss;
    const Tensor& g = gpt.params().flat_grads();
    out.grads[static_cast<size_t>(r)].assign(g.f32(), g.f32() + g.numel());
    for (const comm::OpType op :
         {comm::OpType::kAllGather, comm::OpType::kReduceScatter, comm::OpType::kAllToAll})
      out.bytes[static_cast<size_t>(r)][op] = epg.recorder().bytes(epg.name(), op);
    for (int l = 0; l < c.n_layer; ++l)
      out.shadows[static_cast<size_t>(r)] += a.blocks[static_cast<size_t>(l)].moe.shadows;
  });
  return out;
}

TEST(EpShadows, AllRowsOnOneRanksExpertsRunWhereTheyAreAndMatchTheExchange) {
  const ShadowRun plain = run_zero_router(false), shadowed = run_zero_router(true);
  const model::GptConfig c = model::preset("mixtral-tiny");
  const int64_t layers = 2, E = c.moe.n_experts, C = c.d_model, F = c.expert_ff();
  const int64_t W = 2 * F * C + C * F;  // one SwiGLU expert's c_fc and c_proj, no biases
  for (int r = 0; r < 2; ++r) {
    const size_t ri = static_cast<size_t>(r);
    EXPECT_EQ(plain.shadows[ri], 0);
    EXPECT_EQ(shadowed.shadows[ri], 2 * layers) << "experts 0 and 1 in each layer";
    EXPECT_NEAR(shadowed.loss[ri], plain.loss[ri], 1e-6 * std::abs(plain.loss[ri]));
    const std::vector<float>&g0 = plain.grads[ri], &g1 = shadowed.grads[ri];
    ASSERT_EQ(g0.size(), g1.size());
    float largest = 0;
    for (const float v : g0) largest = std::max(largest, std::abs(v));
    size_t worst = 0;
    for (size_t i = 0; i < g0.size(); ++i)
      if (std::abs(g0[i] - g1[i]) > std::abs(g0[worst] - g1[worst])) worst = i;
    EXPECT_LE(std::abs(g0[worst] - g1[worst]), 1e-5 * largest)
        << "rank " << r << " element " << worst << ": " << g0[worst] << " unshadowed, " << g1[worst]
        << " shadowed";
    // Bytes: per layer the counts, rank 0's two experts out (all_gather) and their gradients
    // back (reduce_scatter); the four row exchanges move nothing.
    const auto& b = shadowed.bytes[ri];
    const int64_t weights = 2 * W * 4 * layers;
    EXPECT_EQ(b.at(comm::OpType::kAllGather).sent_bytes, E * 4 * layers + (r == 0 ? weights : 0));
    EXPECT_EQ(b.at(comm::OpType::kAllGather).recv_bytes, E * 4 * layers + (r == 1 ? weights : 0));
    EXPECT_EQ(b.at(comm::OpType::kAllGather).ops, 2 * layers);
    EXPECT_EQ(b.at(comm::OpType::kReduceScatter).sent_bytes, r == 1 ? weights : 0);
    EXPECT_EQ(b.at(comm::OpType::kReduceScatter).recv_bytes, r == 0 ? weights : 0);
    EXPECT_EQ(b.at(comm::OpType::kReduceScatter).ops, layers);
    EXPECT_EQ(b.at(comm::OpType::kAllToAll).sent_bytes, 0);
    EXPECT_EQ(b.at(comm::OpType::kAllToAll).recv_bytes, 0);
    EXPECT_EQ(b.at(comm::OpType::kAllToAll).ops, 4 * layers);
  }
}

}  // namespace
}  // namespace mt::parallel::ep

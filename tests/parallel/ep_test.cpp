// Expert parallelism's token exchange (parallel/expert.h): rows reach the rank of their
// expert grouped by local expert and come back where they were, whatever the counts (an
// expert nobody routes to, a rank that routes nothing at all); and in a model, the ep
// group's bytes are exactly the routed rows times the width, plus the counts.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace mt::parallel::ep

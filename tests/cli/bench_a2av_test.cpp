// `meshtrain bench comm`'s all_to_all_v: its counts (cli/bench_a2av.h) and the check of
// what arrived, which must pass on a real exchange and catch wrong data, a piece from the
// wrong offset and a piece from the wrong source. Nothing here is timed.
#include "cli/bench_a2av.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <numeric>
#include <vector>

#include "comm/comm_test_util.h"
#include "comm/group.h"
#include "test_util.h"

namespace mt::cli {
namespace {

constexpr int64_t kWidth = 16;

// What rank `me` receives from a correct all_to_all_v, run on the local backend.
std::vector<std::vector<float>> exchange(A2avPattern p, int n, int64_t elems) {
  std::vector<std::vector<float>> outs(static_cast<size_t>(n));
  comm::testing::run_local(n, [&](comm::Group& g) {
    const int me = g.rank();
    const A2avCounts c = a2av_counts(p, me, n, elems, kWidth);
    std::vector<float> in(static_cast<size_t>(elems)), out(static_cast<size_t>(c.recv_total));
    fill_a2av_input(in.data(), me, elems);
    g.all_to_all_v(comm::Buf(in.data(), c.send_total), comm::Buf(out.data(), c.recv_total), c.send,
                   c.recv);
    outs[static_cast<size_t>(me)] = out;
  });
  return outs;
}

TEST(BenchA2av, CountsSendWhatTheBufferHoldsAndReceiveWhatPeersSend) {
  for (A2avPattern p : {A2avPattern::kSkew, A2avPattern::kMoe})
    for (int n = 1; n <= 8; ++n)
      for (int64_t rows : {0, 1, 7, 100, 1000}) {
        const int64_t elems = rows * kWidth;
        std::vector<int64_t> received(static_cast<size_t>(n));
        int64_t sent = 0;
        for (int s = 0; s < n; ++s) {
          const A2avCounts c = a2av_counts(p, s, n, elems, kWidth);
          EXPECT_LE(c.send_total, elems);
          if (p == A2avPattern::kMoe) {
            EXPECT_EQ(c.send_total, elems) << "every row goes out";
          }
          for (int d = 0; d < n; ++d) {
            EXPECT_GE(c.send[size_t(d)], 0);
            if (p == A2avPattern::kMoe) {
              EXPECT_EQ(c.send[size_t(d)] % kWidth, 0) << "whole rows";
            }
            EXPECT_EQ(c.send[size_t(d)], a2av_counts(p, d, n, elems, kWidth).recv[size_t(s)]);
            received[size_t(d)] += c.send[size_t(d)];
          }
          sent += c.send_total;
        }
        for (int d = 0; d < n; ++d)
          EXPECT_EQ(received[size_t(d)], a2av_counts(p, d, n, elems, kWidth).recv_total);
        EXPECT_EQ(std::accumulate(received.begin(), received.end(), int64_t{0}), sent);
      }
}

// MoE dispatch is imbalanced on the receiving side: the hottest rank gets 1.25x the mean
// of 1000 rows at 2 ranks (w(0, .) = (1, 3), w(1, .) = (2, 2): 750 + 500 rows), 1.5x at 4.
TEST(BenchA2av, MoeCountsLoadTheHigherRanks) {
  const int64_t elems = 1000 * kWidth;
  EXPECT_EQ(a2av_counts(A2avPattern::kMoe, 1, 2, elems, kWidth).recv_total, 1250 * kWidth);
  EXPECT_EQ(a2av_counts(A2avPattern::kMoe, 0, 2, elems, kWidth).recv_total, 750 * kWidth);
  EXPECT_EQ(a2av_counts(A2avPattern::kMoe, 3, 4, elems, kWidth).recv_total, 1500 * kWidth);
  // Some rows stay local (not so in the skew pattern at 2 ranks).
  EXPECT_GT(a2av_counts(A2avPattern::kMoe, 0, 2, elems, kWidth).send[0], 0);
}

TEST(BenchA2av, CheckPassesWhatACorrectExchangeDelivers) {
  for (A2avPattern p : {A2avPattern::kSkew, A2avPattern::kMoe})
    for (int n = 1; n <= 4; ++n) {
      const int64_t elems = 37 * kWidth;
      const auto outs = exchange(p, n, elems);
      for (int me = 0; me < n; ++me) {
        const A2avCheck c = check_a2av_output(p, me, n, elems, kWidth, outs[size_t(me)].data());
        EXPECT_EQ(c.wrong, 0) << "n " << n << " rank " << me << " first " << c.first;
      }
    }
}

TEST(BenchA2av, CheckCatchesOneWrongElement) {
  const int n = 3;
  const int64_t elems = 50 * kWidth;
  auto outs = exchange(A2avPattern::kMoe, n, elems);
  std::vector<float>& out = outs[2];
  const int64_t at = static_cast<int64_t>(out.size()) / 2;
  out[size_t(at)] += 1.0f;
  const A2avCheck c = check_a2av_output(A2avPattern::kMoe, 2, n, elems, kWidth, out.data());
  EXPECT_EQ(c.wrong, 1);
  EXPECT_EQ(c.first, at);
  EXPECT_EQ(c.want, c.got - 1.0f);
}

// A transport that starts a piece one row off in its source (a displacement bug), or that
// gives each rank its neighbour's piece (a rank bug), moves the right number of bytes.
TEST(BenchA2av, CheckCatchesAPieceFromTheWrongOffsetOrSource) {
  const int n = 2;
  const int64_t elems = 40 * kWidth;
  const A2avPattern p = A2avPattern::kMoe;
  const A2avCounts c1 = a2av_counts(p, 1, n, elems, kWidth);
  ASSERT_GT(c1.recv[0], kWidth);
  std::vector<float> src0(static_cast<size_t>(elems)), src1(src0.size());
  fill_a2av_input(src0.data(), 0, elems);
  fill_a2av_input(src1.data(), 1, elems);
  const int64_t from0 = a2av_counts(p, 0, n, elems, kWidth).send[0];  // 0's piece for 1
  const int64_t from1 = c1.send[0];  // 1's piece for itself, after its piece for 0
  std::vector<float> right(static_cast<size_t>(c1.recv_total));
  std::copy_n(src0.begin() + from0, c1.recv[0], right.begin());
  std::copy_n(src1.begin() + from1, c1.recv[1], right.begin() + c1.recv[0]);
  EXPECT_EQ(check_a2av_output(p, 1, n, elems, kWidth, right.data()).wrong, 0);

  std::vector<float> shifted = right;  // rank 0's piece read one row late
  std::copy_n(src0.begin() + from0 + kWidth, c1.recv[0] - kWidth, shifted.begin());
  EXPECT_GT(check_a2av_output(p, 1, n, elems, kWidth, shifted.data()).wrong, 0);

  std::vector<float> swapped = right;  // rank 0's piece taken from rank 1's buffer
  std::copy_n(src1.begin() + from0, c1.recv[0], swapped.begin());
  const A2avCheck bad = check_a2av_output(p, 1, n, elems, kWidth, swapped.data());
  EXPECT_EQ(bad.wrong, c1.recv[0]);
  EXPECT_EQ(bad.first, 0);
}

// The command checks every size before it times it and says so in its rows.
TEST(BenchA2av, BenchCommChecksEverySizeItTimes) {
  const test::RunResult r = test::run_meshtrain(
      "bench comm --backend local --ranks 3 --ops all_to_all_v --counts moe --width 64 "
      "--min-bytes 4096 --max-bytes 65536 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto rows = nlohmann::json::parse(r.output.substr(r.output.find('[')));
  ASSERT_EQ(rows.size(), 3u);  // 4, 16 and 64 KiB
  for (const auto& row : rows) {
    EXPECT_EQ(row.at("checked"), true);
    EXPECT_EQ(row.at("counts"), "moe");
    EXPECT_EQ(row.at("bytes").get<int64_t>() % (64 * 4), 0) << "whole rows of 64 floats";
  }
}

}  // namespace
}  // namespace mt::cli

// The counts and the result check of `meshtrain bench comm`'s all_to_all_v, apart from the
// timing so that a test can run them (tests/cli/bench_a2av_test.cpp).
//
// Two count patterns over a per-rank send buffer of `elems` f32:
//   skew: rank s gives rank d the share ((s + d) mod n) / (n(n-1)/2) of the buffer: a skewed
//         spread with one zero per rank, every rank sending and receiving the same total;
//   moe:  MoE dispatch. The buffer is rows of `width` floats (tokens x top-k rows of
//         d_model); rank s sends rank d rows in proportion to w(s, d) = (d + 1) + (s + d) mod 2
//         (the experts of higher ranks hotter, each source a little different), whole rows,
//         the rounding remainder kept by s itself. Every rank sends all its rows; what
//         arrives is imbalanced: rank n - 1 receives 1.25x the mean at n = 2, 1.5x at n = 4.
// The check: rank s's input element i holds value(s, i), an integer below 2^24 (exact in
// f32); every element rank `me` received must be the value its source put at the offset
// of me's piece.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mt::cli {

enum class A2avPattern { kSkew, kMoe };
A2avPattern parse_a2av_pattern(const std::string& name);  // "skew" or "moe"

struct A2avCounts {
  std::vector<int64_t> send, recv;  // elements, per peer
  int64_t send_total = 0, recv_total = 0;
};

// Rank `me` of n, each with a send buffer of `elems` elements; `width` (moe): floats per row.
A2avCounts a2av_counts(A2avPattern p, int me, int n, int64_t elems, int64_t width);

// The value rank s puts at element i of its input.
float a2av_value(int s, int64_t i);
void fill_a2av_input(float* in, int me, int64_t elems);

struct A2avCheck {
  int64_t wrong = 0;        // elements that differ from what their source sent
  int64_t first = -1;       // the first wrong element's index in `out`
  float got = 0, want = 0;  // its value and the expected one
};

// Checks rank me's output of an all_to_all_v with pattern p (every rank's input filled by
// fill_a2av_input) against what each source sent.
A2avCheck check_a2av_output(A2avPattern p, int me, int n, int64_t elems, int64_t width,
                            const float* out);

}  // namespace mt::cli

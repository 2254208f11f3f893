#include "cli/bench_a2av.h"

#include "core/error.h"

namespace mt::cli {

namespace {

// Elements rank s sends rank d (of n), each rank's buffer `elems` elements.
int64_t count_of(A2avPattern p, int s, int d, int n, int64_t elems, int64_t width) {
  if (p == A2avPattern::kSkew) {
    if (n == 1) return elems;
    const int64_t W = int64_t(n) * (n - 1) / 2;
    return elems * ((s + d) % n) / W;
  }
  const int64_t rows = elems / width;
  auto w = [&](int to) { return int64_t(to + 1) + (s + to) % 2; };
  int64_t W = 0;
  for (int to = 0; to < n; ++to) W += w(to);
  auto share = [&](int to) { return rows * w(to) / W; };
  if (d != s) return share(d) * width;
  int64_t kept = rows;  // the rounding remainder stays with the source
  for (int to = 0; to < n; ++to)
    if (to != s) kept -= share(to);
  return kept * width;
}

// Where rank s's piece for rank d starts in s's input.
int64_t source_offset(A2avPattern p, int s, int d, int n, int64_t elems, int64_t width) {
  int64_t lo = 0;
  for (int to = 0; to < d; ++to) lo += count_of(p, s, to, n, elems, width);
  return lo;
}

}  // namespace

A2avPattern parse_a2av_pattern(const std::string& name) {
  if (name == "skew") return A2avPattern::kSkew;
  if (name == "moe") return A2avPattern::kMoe;
  fail("--counts {}: use skew or moe", name);
}

A2avCounts a2av_counts(A2avPattern p, int me, int n, int64_t elems, int64_t width) {
  if (p == A2avPattern::kMoe && width < 1) fail("--width {}: need at least 1 float per row", width);
  A2avCounts c;
  for (int peer = 0; peer < n; ++peer) {
    c.send.push_back(count_of(p, me, peer, n, elems, width));
    c.recv.push_back(count_of(p, peer, me, n, elems, width));
    c.send_total += c.send.back();
    c.recv_total += c.recv.back();
  }
  return c;
}

float a2av_value(int s, int64_t i) {
  // Below 2^24: exact in f32; a piece from the wrong source or offset reads differently.
  return static_cast<float>((int64_t(s) * 1000003 + i) % (int64_t{1} << 24));
}

void fill_a2av_input(float* in, int me, int64_t elems) {
  for (int64_t i = 0; i < elems; ++i) in[i] = a2av_value(me, i);
}

A2avCheck check_a2av_output(A2avPattern p, int me, int n, int64_t elems, int64_t width,
                            const float* out) {
  A2avCheck r;
  int64_t at = 0;
  for (int s = 0; s < n; ++s) {
    const int64_t count = count_of(p, s, me, n, elems, width);
    const int64_t from = source_offset(p, s, me, n, elems, width);
    for (int64_t j = 0; j < count; ++j, ++at) {
      const float want = a2av_value(s, from + j);
      if (out[at] == want) continue;
      if (r.wrong++ == 0) {
        r.first = at;
        r.got = out[at];
        r.want = want;
      }
    }
  }
  return r;
}

}  // namespace mt::cli

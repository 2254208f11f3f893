// all_to_all_v (MoE dispatch / combine) on any group: random per-peer counts with zeros,
// one rank that sends nothing at all and one that receives nothing, against a reference
// every rank computes locally (each rank's input is a function of (seed, rank)); bitwise,
// as the transport only moves bytes. The recorder's bytes must equal the counts exactly.
#pragma once

#include <gtest/gtest.h>

#include <cstring>

#include "collective_checks.h"
#include "comm/group.h"

namespace mt::comm::testing {

// Elements rank s sends to rank d: 0..6 from a hash of (seed, s, d), about a third zero;
// rank 0 sends nothing and rank n - 1 receives nothing (with n >= 2).
inline int64_t a2av_count(uint64_t seed, int s, int d, int n) {
  if (n >= 2 && (s == 0 || d == n - 1)) return 0;
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(s) * 1000003u +
               static_cast<uint64_t>(d) * 7919u;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  const int64_t v = static_cast<int64_t>(x % 9);
  return v < 3 ? 0 : v - 2;
}

inline void check_all_to_all_v(Group& g, DType dt, uint64_t seed) {
  const int n = g.size(), me = g.rank();
  const int64_t es = dtype_bytes(dt);
  auto counts_of = [&](int s) {
    std::vector<int64_t> c(static_cast<size_t>(n));
    for (int d = 0; d < n; ++d) c[static_cast<size_t>(d)] = a2av_count(seed, s, d, n);
    return c;
  };
  const std::vector<int64_t> send = counts_of(me);
  std::vector<int64_t> want_recv(static_cast<size_t>(n));
  for (int s = 0; s < n; ++s) want_recv[static_cast<size_t>(s)] = a2av_count(seed, s, me, n);

  g.recorder().reset_counters();
  const std::vector<int64_t> recv = g.exchange_counts(send);
  EXPECT_EQ(recv, want_recv) << "exchange_counts n=" << n << " rank " << me;

  const auto soff = offsets(send), roff = offsets(recv);
  Host in = Host::random(dt, soff.back(), seed, static_cast<uint64_t>(me));
  Host expect(dt, roff.back());
  for (int s = 0; s < n; ++s) {
    const std::vector<int64_t> sc = counts_of(s);
    Host theirs = Host::random(dt, offsets(sc).back(), seed, static_cast<uint64_t>(s));
    if (recv[static_cast<size_t>(s)] > 0)
      std::memcpy(expect.ptr(roff[static_cast<size_t>(s)]), theirs.ptr(offsets(sc)[size_t(me)]),
                  static_cast<size_t>(recv[static_cast<size_t>(s)] * es));
  }
  // A canary past the end: a receive that writes beyond its counts shows up here.
  Host out(dt, roff.back() + 1);
  std::memset(out.ptr(0), 0x5A, static_cast<size_t>((roff.back() + 1) * es));
  Host canary = out;
  g.all_to_all_v(Buf(in.ptr(0), soff.back(), dt), Buf(out.ptr(0), roff.back(), dt), send, recv);
  const auto body = out.raw.begin() + static_cast<std::ptrdiff_t>(roff.back() * es);
  EXPECT_EQ(std::vector<uint8_t>(out.raw.begin(), body), expect.raw)
      << "all_to_all_v n=" << n << " rank " << me;
  EXPECT_EQ(std::vector<uint8_t>(body, out.raw.end()),
            std::vector<uint8_t>(canary.raw.end() - es, canary.raw.end()))
      << "all_to_all_v wrote past its receive counts, rank " << me;

  // Exact bytes: the counts exchange (two i32 per peer) and the data to and from the others.
  int64_t sent = 8 * (n - 1), got = 8 * (n - 1);
  for (int r = 0; r < n; ++r)
    if (r != me) {
      sent += send[static_cast<size_t>(r)] * es;
      got += recv[static_cast<size_t>(r)] * es;
    }
  const ByteCount b = g.recorder().bytes(g.name(), OpType::kAllToAll);
  EXPECT_EQ(b.sent_bytes, sent) << "rank " << me;
  EXPECT_EQ(b.recv_bytes, got) << "rank " << me;
  EXPECT_EQ(b.ops, 2);
}

// The convenience form: counts exchanged inside, the output sized to what arrives.
inline void check_all_to_all_v_vector(Group& g, uint64_t seed) {
  const int n = g.size(), me = g.rank();
  std::vector<int64_t> send(static_cast<size_t>(n));
  for (int d = 0; d < n; ++d) send[size_t(d)] = a2av_count(seed, me, d, n);
  std::vector<float> in;
  for (int d = 0; d < n; ++d)
    for (int64_t i = 0; i < send[size_t(d)]; ++i) in.push_back(float(me * 1000 + d * 10 + i));
  std::vector<float> out;
  const std::vector<int64_t> recv = g.all_to_all_v(in.data(), out, send);
  std::vector<float> expect;
  for (int s = 0; s < n; ++s)
    for (int64_t i = 0; i < a2av_count(seed, s, me, n); ++i)
      expect.push_back(float(s * 1000 + me * 10 + i));
  EXPECT_EQ(out, expect) << "all_to_all_v (vector) n=" << n << " rank " << me;
  EXPECT_EQ(int64_t(out.size()), offsets(recv).back());
}

}  // namespace mt::comm::testing

// Every collective against a plain reference, on any group (local threads or MPI ranks).
// Each rank's input is a function of (seed, group rank), so every rank computes the
// reference of all others locally. Results must match bitwise: the reduction is in f32, in
// rank order, rounded once (docs/comm.md).
#pragma once

#include <gtest/gtest.h>

#include <numeric>

#include "comm/group.h"
#include "comm_test_util.h"

namespace mt::comm::testing {

inline std::vector<int64_t> offsets(const std::vector<int64_t>& c) {
  std::vector<int64_t> o(c.size() + 1, 0);
  for (size_t i = 0; i < c.size(); ++i) o[i + 1] = o[i] + c[i];
  return o;
}

inline void check_all_reduce(Group& g, DType dt, ReduceOp op, bool in_place, int64_t elems,
                             uint64_t seed = 1) {
  const int n = g.size(), me = g.rank();
  std::vector<Host> ins;
  for (int k = 0; k < n; ++k) ins.push_back(Host::random(dt, elems, seed, k));
  Host expect(dt, elems);
  for (int64_t i = 0; i < elems; ++i) expect.set(i, reference_reduce(ins, i, op));
  Host out(dt, elems);
  if (in_place) {
    out = ins[me];
    g.all_reduce(out.buf(), op);
  } else {
    Host in = ins[me];
    g.all_reduce(in.buf(), out.buf(), op);
    EXPECT_EQ(in.raw, ins[me].raw) << "all_reduce changed its input";
  }
  EXPECT_EQ(out.raw, expect.raw) << "all_reduce " << reduce_name(op) << " " << dtype_name(dt)
                                 << " n=" << n << " elems=" << elems << " in_place=" << in_place
                                 << " on " << g.name();
}

// Uneven counts when `uneven`: rank r's piece has base + r % 3 elements.
inline std::vector<int64_t> piece_counts(int n, int64_t base, bool uneven) {
  std::vector<int64_t> c(static_cast<size_t>(n), base);
  if (uneven)
    for (int r = 0; r < n; ++r) c[static_cast<size_t>(r)] = base + r % 3;
  return c;
}

inline void check_reduce_scatter(Group& g, DType dt, ReduceOp op, bool in_place, int64_t base,
                                 bool uneven, uint64_t seed = 2) {
  const int n = g.size(), me = g.rank();
  auto counts = piece_counts(n, base, uneven);
  auto off = offsets(counts);
  std::vector<Host> ins;
  for (int k = 0; k < n; ++k) ins.push_back(Host::random(dt, off[n], seed, k));
  Host expect(dt, counts[me]);
  for (int64_t i = 0; i < counts[me]; ++i) expect.set(i, reference_reduce(ins, off[me] + i, op));
  Host in = ins[me];
  Host got(dt, counts[me]);
  if (in_place) {
    Buf piece = in.buf(off[me], counts[me]);
    uneven ? g.reduce_scatter(in.buf(), piece, counts, op) : g.reduce_scatter(in.buf(), piece, op);
    std::memcpy(got.ptr(), in.ptr(off[me]), got.raw.size());
  } else {
    uneven ? g.reduce_scatter(in.buf(), got.buf(), counts, op)
           : g.reduce_scatter(in.buf(), got.buf(), op);
  }
  EXPECT_EQ(got.raw, expect.raw) << "reduce_scatter " << dtype_name(dt) << " n=" << n
                                 << " uneven=" << uneven << " in_place=" << in_place;
}

inline void check_all_gather(Group& g, DType dt, bool in_place, int64_t base, bool uneven,
                             uint64_t seed = 3) {
  const int n = g.size(), me = g.rank();
  auto counts = piece_counts(n, base, uneven);
  auto off = offsets(counts);
  Host expect(dt, off[n]);
  for (int k = 0; k < n; ++k) {
    Host piece = Host::random(dt, counts[k], seed, k);
    std::memcpy(expect.ptr(off[k]), piece.ptr(), piece.raw.size());
  }
  Host mine = Host::random(dt, counts[me], seed, me);
  Host out(dt, off[n]);
  if (in_place) {
    std::memcpy(out.ptr(off[me]), mine.ptr(), mine.raw.size());
    Buf piece = out.buf(off[me], counts[me]);
    uneven ? g.all_gather(piece, out.buf(), counts) : g.all_gather(piece, out.buf());
  } else {
    uneven ? g.all_gather(mine.buf(), out.buf(), counts) : g.all_gather(mine.buf(), out.buf());
  }
  EXPECT_EQ(out.raw, expect.raw) << "all_gather " << dtype_name(dt) << " n=" << n
                                 << " uneven=" << uneven << " in_place=" << in_place;
}

inline void check_broadcast(Group& g, DType dt, int root, int64_t elems, uint64_t seed = 4) {
  Host expect = Host::random(dt, elems, seed, static_cast<uint64_t>(root));
  Host data = g.rank() == root ? expect : Host(dt, elems);
  g.broadcast(data.buf(), root);
  EXPECT_EQ(data.raw, expect.raw) << "broadcast root=" << root << " n=" << g.size();
}

// Rank s sends count(s, d) elements to rank d: uneven, some zero.
inline int64_t a2a_count(int s, int d) { return (s + 2 * d) % 4 + (s == d ? 1 : 0); }

inline void check_all_to_all(Group& g, DType dt, uint64_t seed = 5) {
  const int n = g.size(), me = g.rank();
  std::vector<int64_t> send(n), recv(n);
  for (int d = 0; d < n; ++d) send[d] = a2a_count(me, d);
  for (int s = 0; s < n; ++s) recv[s] = a2a_count(s, me);
  auto soff = offsets(send);
  auto roff = offsets(recv);
  Host in = Host::random(dt, soff[n], seed, me);
  Host expect(dt, roff[n]);
  for (int s = 0; s < n; ++s) {
    std::vector<int64_t> sc(n);
    for (int d = 0; d < n; ++d) sc[d] = a2a_count(s, d);
    Host theirs = Host::random(dt, offsets(sc)[n], seed, s);
    std::memcpy(expect.ptr(roff[s]), theirs.ptr(offsets(sc)[me]),
                static_cast<size_t>(recv[s] * dtype_bytes(dt)));
  }
  Host out(dt, roff[n]);
  g.all_to_all(in.buf(), out.buf(), send, recv);
  EXPECT_EQ(out.raw, expect.raw) << "all_to_all uneven n=" << n;
  // Equal pieces.
  const int64_t piece = 5;
  Host ein = Host::random(dt, piece * n, seed + 1, me), eout(dt, piece * n), eexp(dt, piece * n);
  for (int s = 0; s < n; ++s) {
    Host theirs = Host::random(dt, piece * n, seed + 1, s);
    std::memcpy(eexp.ptr(s * piece), theirs.ptr(me * piece),
                static_cast<size_t>(piece * dtype_bytes(dt)));
  }
  g.all_to_all(ein.buf(), eout.buf());
  EXPECT_EQ(eout.raw, eexp.raw) << "all_to_all equal n=" << n;
}

// Everything above on one group.
inline void check_all_collectives(Group& g) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax})
      for (bool in_place : {false, true})
        for (int64_t elems : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{4099}})
          check_all_reduce(g, dt, op, in_place, elems);
    for (bool uneven : {false, true})
      for (bool in_place : {false, true}) {
        check_reduce_scatter(g, dt, ReduceOp::kSum, in_place, 37, uneven);
        check_reduce_scatter(g, dt, ReduceOp::kMax, in_place, 3, uneven);
        check_all_gather(g, dt, in_place, 37, uneven);
        check_all_gather(g, dt, in_place, 0, uneven);
      }
    for (int root = 0; root < g.size(); ++root) check_broadcast(g, dt, root, 33);
    check_all_to_all(g, dt);
  }
  g.barrier();
}

// Send/recv in both directions at once, ring shifts and pairwise, several tags.
inline void check_send_recv(Group& g) {
  const int n = g.size(), me = g.rank();
  const int right = (me + 1) % n, left = (me + n - 1) % n;
  for (int64_t elems : {int64_t{1}, int64_t{1000}, int64_t{100000}}) {
    Host out = Host::random(DType::kF32, elems, 6, me), in(DType::kF32, elems);
    g.send_recv(out.buf(), right, in.buf(), left, 3);
    EXPECT_EQ(in.raw, Host::random(DType::kF32, elems, 6, left).raw);
    // Both directions at once with async sends, two tags interleaved.
    Host a = Host::random(DType::kBF16, elems, 7, me), b = Host::random(DType::kBF16, elems, 8, me);
    Host ra(DType::kBF16, elems), rb(DType::kBF16, elems);
    auto s1 = g.send_async(a.buf(), right, 1);
    auto s2 = g.send_async(b.buf(), left, 2);
    auto r2 = g.recv_async(rb.buf(), right, 2);
    g.recv(ra.buf(), left, 1);
    r2->wait();
    s1->wait();
    s2->wait();
    EXPECT_EQ(ra.raw, Host::random(DType::kBF16, elems, 7, left).raw);
    EXPECT_EQ(rb.raw, Host::random(DType::kBF16, elems, 8, right).raw);
  }
  // Blocking send and recv in opposite orders on the two sides of each pair.
  if (n >= 2 && me < n / 2 * 2) {
    int peer = me ^ 1;
    Host mine = Host::random(DType::kF32, 64, 9, me), theirs(DType::kF32, 64);
    if (me % 2 == 0) {
      g.send(mine.buf(), peer);
      g.recv(theirs.buf(), peer);
    } else {
      g.recv(theirs.buf(), peer);
      g.send(mine.buf(), peer);
    }
    EXPECT_EQ(theirs.raw, Host::random(DType::kF32, 64, 9, peer).raw);
  }
  g.barrier();
}

}  // namespace mt::comm::testing

// Helpers shared by the comm tests: deterministic inputs and plain references.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "comm/launch.h"
#include "core/dtype.h"
#include "core/philox.h"

namespace mt::comm::testing {

// A host buffer of `n` elements of `dt`, element i of (seed, stream) uniform in [-4, 4).
struct Host {
  DType dt = DType::kF32;
  std::vector<uint8_t> raw;
  Host() = default;
  Host(DType t, int64_t n) : dt(t), raw(static_cast<size_t>(n * dtype_bytes(t)), 0) {}
  static Host random(DType t, int64_t n, uint64_t seed, uint64_t stream) {
    Host h(t, n);
    for (int64_t i = 0; i < n; ++i) h.set(i, 8 * rng::uniform(seed, stream, i) - 4);
    return h;
  }
  int64_t elems() const { return static_cast<int64_t>(raw.size()) / dtype_bytes(dt); }
  void* ptr(int64_t off = 0) { return raw.data() + off * dtype_bytes(dt); }
  Buf buf(int64_t off = 0, int64_t n = -1) { return Buf(ptr(off), n < 0 ? elems() - off : n, dt); }
  float get(int64_t i) const {
    if (dt == DType::kF32) {
      float f;
      std::memcpy(&f, raw.data() + i * 4, 4);
      return f;
    }
    bf16 b;
    std::memcpy(&b, raw.data() + i * 2, 2);
    return bf16_to_f32(b);
  }
  void set(int64_t i, float v) {
    if (dt == DType::kF32) {
      std::memcpy(raw.data() + i * 4, &v, 4);
    } else {
      bf16 b = f32_to_bf16(v);
      std::memcpy(raw.data() + i * 2, &b, 2);
    }
  }
};

// The reference reduction of element i over inputs[0..n) in rank order, in f32, rounded
// once to the dtype: what every backend must produce bitwise.
inline float reference_reduce(const std::vector<Host>& in, int64_t i, ReduceOp op) {
  float acc = in[0].get(i);
  for (size_t k = 1; k < in.size(); ++k)
    acc = op == ReduceOp::kMax ? std::max(acc, in[k].get(i)) : acc + in[k].get(i);
  if (op == ReduceOp::kAvg) acc /= static_cast<float>(in.size());
  return acc;
}

inline uint32_t bits_of(float f, DType dt) {
  if (dt == DType::kBF16) return f32_to_bf16(f).bits;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline void run_local(int n, const std::function<void(Group&)>& fn, double timeout_s = 60) {
  LaunchOptions o;
  o.backend = BackendKind::kLocal;
  o.world_size = n;
  o.timeout_s = timeout_s;
  launch(o, fn);
}

// The collectives' byte counters against the ring formulas of docs/comm.md (Patarasuk &
// Yuan 2009; NCCL's busbw factor), both dtypes, on buffers of type Buffer (host: Host; GPU:
// the nccl test's Dev): constructible from (DType, elems), with buf().
template <class Buffer>
void check_ring_byte_counters(Group& g) {
  const int n = g.size();
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const int64_t E = 840 * 3;  // divisible by 1..8: the formulas are integers
    const int64_t S = E * dtype_bytes(dt);
    Buffer a(dt, E);
    g.recorder().reset_counters();
    g.all_reduce(a.buf());
    g.all_reduce(a.buf(), ReduceOp::kAvg);
    // Ring all-reduce: each rank sends and receives 2(n-1)/n * S per call.
    ByteCount ar = g.recorder().bytes(g.name(), OpType::kAllReduce);
    EXPECT_EQ(ar.sent_bytes, 2 * 2 * (n - 1) * S / n);
    EXPECT_EQ(ar.recv_bytes, 2 * 2 * (n - 1) * S / n);
    EXPECT_EQ(ar.ops, 2);
    Buffer piece(dt, E / n), full(dt, E);
    g.all_gather(piece.buf(), full.buf());  // S = output size
    ByteCount ag = g.recorder().bytes(g.name(), OpType::kAllGather);
    EXPECT_EQ(ag.sent_bytes, (n - 1) * S / n);
    EXPECT_EQ(ag.recv_bytes, (n - 1) * S / n);
    g.reduce_scatter(full.buf(), piece.buf());  // S = input size
    ByteCount rs = g.recorder().bytes(g.name(), OpType::kReduceScatter);
    EXPECT_EQ(rs.sent_bytes, (n - 1) * S / n);
    EXPECT_EQ(rs.recv_bytes, (n - 1) * S / n);
    Buffer x(dt, E), y(dt, E);
    g.all_to_all(x.buf(), y.buf());
    ByteCount aa = g.recorder().bytes(g.name(), OpType::kAllToAll);
    EXPECT_EQ(aa.sent_bytes, (n - 1) * S / n);
    EXPECT_EQ(aa.recv_bytes, (n - 1) * S / n);
    if (n >= 2) {
      g.send_recv(x.buf(), (g.rank() + 1) % n, y.buf(), (g.rank() + n - 1) % n);
      EXPECT_EQ(g.recorder().bytes(g.name(), OpType::kSend).sent_bytes, S);
      EXPECT_EQ(g.recorder().bytes(g.name(), OpType::kRecv).recv_bytes, S);
    }
    g.barrier();
  }
}

}  // namespace mt::comm::testing

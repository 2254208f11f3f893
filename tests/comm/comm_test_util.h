// Helpers shared by the comm tests: deterministic inputs and plain references.
#pragma once

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

}  // namespace mt::comm::testing

// Element types: f32 and bf16 (bfloat16: the top 16 bits of an IEEE f32), and i32 for
// token ids on a GPU (never reduced or communicated).
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace mt {

enum class DType : uint8_t { kF32, kBF16, kI32 };

constexpr int64_t dtype_bytes(DType t) { return t == DType::kBF16 ? 2 : 4; }
constexpr std::string_view dtype_name(DType t) {
  return t == DType::kF32 ? "f32" : t == DType::kBF16 ? "bf16" : "i32";
}

struct bf16 {
  uint16_t bits = 0;
};

inline float bf16_to_f32(bf16 x) {
  uint32_t u = static_cast<uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest, ties to even; NaN stays NaN.
inline bf16 f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x40u)};
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>((u + rounding) >> 16)};
}

}  // namespace mt

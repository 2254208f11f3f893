#include "train/outer_compress.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"

namespace mt::train {

OuterCompress parse_outer_compress(const std::string& name) {
  if (name == "none") return OuterCompress::kNone;
  if (name == "bf16") return OuterCompress::kBf16;
  if (name == "int8") return OuterCompress::kInt8;
  fail(
      "--outer-compress '{}' is not a compression of the outer exchange (choose none, bf16 or "
      "int8)",
      name);
}

const char* outer_compress_name(OuterCompress c) {
  return c == OuterCompress::kNone ? "none" : c == OuterCompress::kBf16 ? "bf16" : "int8";
}

int64_t outer_encoded_words(OuterCompress c, int64_t elems) {
  switch (c) {
    case OuterCompress::kNone:
      return elems;
    case OuterCompress::kBf16:
      return (elems + 1) / 2;
    case OuterCompress::kInt8:
      return elems / kOuterBlock + (elems + 3) / 4;
  }
  return elems;
}

// int8 layout of a run of blocks: the f32 scales of every block first, then the int8 values.
void outer_encode(OuterCompress c, const float* x, int64_t elems, int32_t* words) {
  if (c == OuterCompress::kNone) {
    std::memcpy(words, x, static_cast<size_t>(elems) * 4);
    return;
  }
  if (c == OuterCompress::kBf16) {
    auto* out = reinterpret_cast<bf16*>(words);
    for (int64_t i = 0; i < elems; ++i) out[i] = f32_to_bf16(x[i]);
    if (elems % 2) out[elems] = bf16{};
    return;
  }
  const int64_t blocks = elems / kOuterBlock;
  auto* scales = reinterpret_cast<float*>(words);
  auto* q = reinterpret_cast<int8_t*>(words + blocks);
  for (int64_t b = 0; b < blocks; ++b) {
    const float* xb = x + b * kOuterBlock;
    float m = 0;
    for (int64_t i = 0; i < kOuterBlock; ++i) m = std::max(m, std::fabs(xb[i]));
    const float s = m / 127.0f;
    scales[b] = s;
    for (int64_t i = 0; i < kOuterBlock; ++i) {
      const float r = s > 0 ? std::nearbyint(xb[i] / s) : 0.0f;
      q[b * kOuterBlock + i] = static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
    }
  }
  const int64_t tail = (elems + 3) / 4 * 4 - elems;  // padding bytes of the last word
  std::memset(q + elems, 0, static_cast<size_t>(tail));
}

void outer_decode(OuterCompress c, const int32_t* words, int64_t elems, float* y) {
  if (c == OuterCompress::kNone) {
    std::memcpy(y, words, static_cast<size_t>(elems) * 4);
    return;
  }
  if (c == OuterCompress::kBf16) {
    const auto* in = reinterpret_cast<const bf16*>(words);
    for (int64_t i = 0; i < elems; ++i) y[i] = bf16_to_f32(in[i]);
    return;
  }
  const int64_t blocks = elems / kOuterBlock;
  const auto* scales = reinterpret_cast<const float*>(words);
  const auto* q = reinterpret_cast<const int8_t*>(words + blocks);
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t i = 0; i < kOuterBlock; ++i)
      y[b * kOuterBlock + i] = static_cast<float>(q[b * kOuterBlock + i]) * scales[b];
}

double outer_roundtrip_bound(OuterCompress c, double ref) {
  switch (c) {
    case OuterCompress::kNone:
      return 0;
    case OuterCompress::kBf16:
      return std::ldexp(ref, -8);
    case OuterCompress::kInt8:
      return ref / 254.0 * (1 + std::ldexp(1.0, -14));
  }
  return 0;
}

}  // namespace mt::train

// Compression of DiLoCo's outer exchange (docs/diloco.md): each site's pseudo-gradient
// (outer parameters - site parameters) travels as bf16, or as 8-bit integers with one f32
// scale per block of kOuterBlock elements. Encoded data is packed into 32-bit words so that
// it travels through the f32/i32 collectives of comm::Group byte for byte.
//
// The error of one encode/decode of an element x (derived in docs/diloco.md):
//   bf16: round to nearest even on 8 significant bits, |dec(enc(x)) - x| <= 2^-8 |x|
//   int8: scale s = fl(M / 127), M the block's max |x|; q = round(x / s) in [-127, 127];
//         |dec(enc(x)) - x| <= (M / 254)(1 + 2^-14)  (s/2, plus the f32 roundings of M/127,
//         x/s and q*s, each at most 2^-24 relative)
#pragma once

#include <cstdint>
#include <string>

namespace mt::train {

enum class OuterCompress { kNone, kBf16, kInt8 };
OuterCompress parse_outer_compress(const std::string& name);  // refuses another name
const char* outer_compress_name(OuterCompress c);

inline constexpr int64_t kOuterBlock = 128;  // int8: elements per scale

// 32-bit words that `elems` elements (a multiple of kOuterBlock) take encoded.
int64_t outer_encoded_words(OuterCompress c, int64_t elems);
// Encodes x[0, elems) into `words` (outer_encoded_words of them); elems % kOuterBlock == 0.
void outer_encode(OuterCompress c, const float* x, int64_t elems, int32_t* words);
// Decodes `words` into y[0, elems).
void outer_decode(OuterCompress c, const int32_t* words, int64_t elems, float* y);

// The bound above for one element: bf16 `ref` is |x|, int8 `ref` is its block's max |x|.
double outer_roundtrip_bound(OuterCompress c, double ref);

}  // namespace mt::train

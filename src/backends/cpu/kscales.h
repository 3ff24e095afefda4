#pragma once
// Unpacking of the 6-bit sub-block scales of the k-quants in the shapes the kernels want;
// the bit layout itself lives in quant/k_scales.h.
//
// Internal linkage on purpose: this header is included by files compiled for different
// instruction sets, and an inline function with external linkage would be merged across them by
// the linker, so the portable kernels could end up calling an AVX-512 copy.
#include <cstdint>
#include <cstring>

#include "core/blocks.h"
#include "quant/k_scales.h"

namespace tandem::cpu {
namespace {

struct KScales {
  uint8_t scale[8];
  uint8_t min[8];
};

inline KScales unpack_k_scales(const uint8_t packed[kKScaleBytes]) {
  KScales s;
  unpack_q4_k_scales(packed, s.scale, s.min);
  return s;
}

// The same unpacking on 32-bit words, four sub-blocks at a time, for the SIMD kernels:
// bytes 0..7 of `out` are the 8 scales, bytes 8..15 the 8 mins.
inline void unpack_k_scales_words(const uint8_t packed[kKScaleBytes], uint32_t out[4]) {
  uint32_t w[3];
  std::memcpy(w, packed, sizeof(w));
  out[0] = w[0] & 0x3f3f3f3f;
  out[1] = (w[2] & 0x0f0f0f0f) | ((w[0] >> 6) & 0x03030303) << 4;
  out[2] = w[1] & 0x3f3f3f3f;
  out[3] = ((w[2] >> 4) & 0x0f0f0f0f) | ((w[1] >> 6) & 0x03030303) << 4;
}

}  // namespace
}  // namespace tandem::cpu

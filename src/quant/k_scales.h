#pragma once
// Bit packing of the k-quant sub-block scales, shared by the scalar reference (src/quant) and
// the SIMD kernels so that both read exactly the same bits. Layouts are GGUF's.
//
// Internal linkage on purpose: kernel files compiled for different instruction sets include
// this header, and inline functions with external linkage would be merged across them by the
// linker, so portable code could end up calling an AVX-512 copy.
#include <cstdint>

#include "core/blocks.h"

namespace tandem {
namespace {  // NOLINT(google-build-namespaces): see the linkage note above

// Q4_K / Q5_K: 8 scales and 8 mins of 6 bits in 12 bytes. Bytes 0..3 hold scales 0..3 and bytes
// 4..7 mins 0..3 in their low 6 bits; the top 2 bits of those 8 bytes are bits 4..5 of scales
// 4..7 and mins 4..7, whose low nibbles sit in bytes 8..11 (scale low, min high).
inline void unpack_q4_k_scales(const uint8_t packed[kKScaleBytes], uint8_t scales[8],
                               uint8_t mins[8]) {
  for (int j = 0; j < 4; ++j) {
    scales[j] = packed[j] & 63;
    mins[j] = packed[j + 4] & 63;
    scales[j + 4] = uint8_t((packed[j + 8] & 0xF) | ((packed[j] >> 6) << 4));
    mins[j + 4] = uint8_t((packed[j + 8] >> 4) | ((packed[j + 4] >> 6) << 4));
  }
}

// Inverse of unpack_q4_k_scales; every input must be in 0..63.
inline void pack_q4_k_scales(const uint8_t scales[8], const uint8_t mins[8],
                             uint8_t packed[kKScaleBytes]) {
  for (int j = 0; j < 4; ++j) {
    packed[j] = uint8_t(scales[j] | ((scales[j + 4] >> 4) << 6));
    packed[j + 4] = uint8_t(mins[j] | ((mins[j + 4] >> 4) << 6));
    packed[j + 8] = uint8_t((scales[j + 4] & 0xF) | ((mins[j + 4] & 0xF) << 4));
  }
}

// Q3_K: 16 scales of 6 bits, stored offset by 32, in 12 bytes. The low nibble of scale i is in
// byte i (i < 8) or the high nibble of byte i - 8; its top 2 bits are bits 2*(i/4)..2*(i/4)+1
// of byte 8 + i%4. Returns the signed scales (stored value - 32), in -32..31.
inline void unpack_q3_k_scales(const uint8_t packed[12], int8_t scales[16]) {
  for (int i = 0; i < 16; ++i) {
    const int low = i < 8 ? (packed[i] & 0xF) : (packed[i - 8] >> 4);
    const int high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
    scales[i] = int8_t((low | (high << 4)) - 32);
  }
}

}  // namespace
}  // namespace tandem

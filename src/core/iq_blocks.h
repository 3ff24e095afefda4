#pragma once
// The grid i-quants (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S): block layouts, as
// GGUF stores them, and each block taken apart into what every consumer needs: 256 small signed
// integer weights and one float scale per group of 16 or 32, with value = scale * weight exactly
// (the reference decoders of src/quant multiply them out; the CPU kernels feed the integers to
// their integer dot products).
//
// Why this is exact: the formats' own values are products like (d * (0.5 + s) * 0.25) * grid *
// sign, where d is an f16 (11 significant bits), s a 4-bit scale and the grid value at most 62,
// so every product is exact in float and can be regrouped. The IQ1 values grid + delta with
// delta = +-1/8 become integers 8 * grid +- 1 (|w| <= 9) with the scale divided by 8. Weights:
// |w| <= 43 (IQ2), 62 (IQ3_XXS), 15 (IQ3_S), 9 (IQ1).
//
// Multi-byte fields are read with memcpy: blocks of 50 to 110 bytes sit at any even offset.
// The functions have internal linkage (as backends/cpu/kscales.h): files compiled for AVX-512
// include this header, and the linker must not hand their copy to portable callers.
#include <cstdint>
#include <cstring>

#include "core/blocks.h"
#include "core/half.h"
#include "core/iq_grids.h"

namespace tandem {

// IQ2_XXS (2.06 bits a weight): per 32 weights, 8 bytes: 4 grid indices (256-point grid), then
// a 32-bit word with four 7-bit sign indices and the 4-bit scale s on top:
// x = d * (0.5 + s) / 4 * grid * sign.
struct BlockIQ2_XXS {
  uint16_t d;
  uint8_t qs[64];
};

// IQ2_XS: per 8 weights a 16-bit word, grid index (512 points) in the low 9 bits, sign index
// above; a 4-bit scale per 16 weights (two per byte of `scales`, low nibble first).
struct BlockIQ2_XS {
  uint16_t d;
  uint8_t qs[64];
  uint8_t scales[8];
};

// IQ2_S: per 8 weights a grid index (1024 points: 8 bits in qs[0..31], 2 in qh) and a sign byte
// (qs[32..63], all 8 signs explicit); scales as IQ2_XS.
struct BlockIQ2_S {
  uint16_t d;
  uint8_t qs[64];
  uint8_t qh[8];
  uint8_t scales[8];
};

// IQ3_XXS: per 32 weights, 8 grid indices of 4 weights (256 points) in qs[8 ib ..], and in
// qs[64 + 4 ib] a word of four 7-bit sign indices and the 4-bit scale s on top:
// x = d * (0.5 + s) / 2 * grid * sign.
struct BlockIQ3_XXS {
  uint16_t d;
  uint8_t qs[96];
};

// IQ3_S: per 4 weights a grid index (512 points: qs byte plus one bit of qh), signs explicit
// (one bit a weight), a 4-bit scale per 32: x = d * (1 + 2 s) * grid * sign.
struct BlockIQ3_S {
  uint16_t d;
  uint8_t qs[64];
  uint8_t qh[8];
  uint8_t signs[32];
  uint8_t scales[4];
};

// IQ1_S: per 8 weights a grid index (2048 points of {-1, 0, 1}^8: 8 bits in qs, 3 in qh); per
// 32 a 16-bit qh word with those high bits, a 3-bit scale s (bits 12-14) and the sign of the
// shift (bit 15): x = d * (2 s + 1) * (grid +- 1/8).
struct BlockIQ1_S {
  uint16_t d;
  uint8_t qs[32];
  uint8_t qh[16];
};

// IQ1_M: IQ1_S's grid; per 8 weights its own shift sign, 3-bit scales per 16, and d (an f16)
// spread over the top nibbles of the four 16-bit scale words.
struct BlockIQ1_M {
  uint8_t qs[32];
  uint8_t qh[16];
  uint8_t scales[8];
};

static_assert(sizeof(BlockIQ2_XXS) == 66 && sizeof(BlockIQ2_XS) == 74 && sizeof(BlockIQ2_S) == 82 &&
              sizeof(BlockIQ3_XXS) == 98 && sizeof(BlockIQ3_S) == 110 && sizeof(BlockIQ1_S) == 50 &&
              sizeof(BlockIQ1_M) == 56);

// A grid block's 256 weights and its scales, one per kIqGroup<Block> weights.
struct IqWeights {
  int8_t w[kQK_K];
  float scale[kQK_K / 16];
};

template <class Block>
inline constexpr int kIqGroup = 32;
template <>
inline constexpr int kIqGroup<BlockIQ2_XS> = 16;
template <>
inline constexpr int kIqGroup<BlockIQ2_S> = 16;
template <>
inline constexpr int kIqGroup<BlockIQ1_M> = 16;

namespace {  // NOLINT(google-build-namespaces)
namespace iq_bytes {

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// n grid bytes with signs (bit j of `signs` set: element j negative) into w.
inline void signed_points(uint64_t point, uint32_t signs, int n, int8_t* w) {
  for (int j = 0; j < n; ++j) {
    const int v = int((point >> (8 * j)) & 0xFF);
    w[j] = int8_t((signs >> j) & 1 ? -v : v);
  }
}

// IQ1: 8 points of {-1, 0, 1} shifted by +-1/8, times 8.
inline void shifted_points(uint64_t point, bool minus, int8_t* w) {
  for (int j = 0; j < 8; ++j) w[j] = int8_t(8 * int8_t((point >> (8 * j)) & 0xFF) + (minus ? -1 : 1));
}

}  // namespace iq_bytes

inline void iq_weights(const BlockIQ2_XXS& block, IqWeights& out) {
  const float d = f16_to_f32(block.d);
  for (int ib = 0; ib < 8; ++ib) {
    const uint8_t* sub = block.qs + 8 * ib;
    const uint32_t signs_scale = iq_bytes::load_u32(sub + 4);
    out.scale[ib] = d * (0.5f + float(signs_scale >> 28)) * 0.25f;
    for (int l = 0; l < 4; ++l)
      iq_bytes::signed_points(kIq2xxsGrid[sub[l]], kIqSigns[(signs_scale >> (7 * l)) & 127], 8,
                               out.w + 32 * ib + 8 * l);
  }
}

// The IQ2_XS / IQ2_S scale of 16 weights: g-th nibble of `scales`.
inline float iq2_scale16(float d, const uint8_t* scales, int g) {
  return d * (0.5f + float((scales[g / 2] >> (4 * (g % 2))) & 0xF)) * 0.25f;
}

inline void iq_weights(const BlockIQ2_XS& block, IqWeights& out) {
  const float d = f16_to_f32(block.d);
  for (int g = 0; g < 16; ++g) out.scale[g] = iq2_scale16(d, block.scales, g);
  for (int k = 0; k < 32; ++k) {
    const uint16_t word = iq_bytes::load_u16(block.qs + 2 * k);
    iq_bytes::signed_points(kIq2xsGrid[word & 511], kIqSigns[word >> 9], 8, out.w + 8 * k);
  }
}

inline void iq_weights(const BlockIQ2_S& block, IqWeights& out) {
  const float d = f16_to_f32(block.d);
  for (int g = 0; g < 16; ++g) out.scale[g] = iq2_scale16(d, block.scales, g);
  for (int k = 0; k < 32; ++k) {
    const int ib = k / 4, l = k % 4;
    const int index = block.qs[k] | ((block.qh[ib] << (8 - 2 * l)) & 0x300);
    iq_bytes::signed_points(kIq2sGrid[size_t(index)], block.qs[32 + k], 8, out.w + 8 * k);
  }
}

inline void iq_weights(const BlockIQ3_XXS& block, IqWeights& out) {
  const float d = f16_to_f32(block.d);
  for (int ib = 0; ib < 8; ++ib) {
    const uint8_t* indices = block.qs + 8 * ib;
    const uint32_t signs_scale = iq_bytes::load_u32(block.qs + 64 + 4 * ib);
    out.scale[ib] = d * (0.5f + float(signs_scale >> 28)) * 0.5f;
    for (int l = 0; l < 4; ++l) {
      const uint32_t signs = kIqSigns[(signs_scale >> (7 * l)) & 127];
      int8_t* w = out.w + 32 * ib + 8 * l;
      iq_bytes::signed_points(kIq3xxsGrid[indices[2 * l]], signs, 4, w);
      iq_bytes::signed_points(kIq3xxsGrid[indices[2 * l + 1]], signs >> 4, 4, w + 4);
    }
  }
}

inline void iq_weights(const BlockIQ3_S& block, IqWeights& out) {
  const float d = f16_to_f32(block.d);
  for (int ib = 0; ib < 8; ++ib) {
    out.scale[ib] = d * float(1 + 2 * ((block.scales[ib / 2] >> (4 * (ib % 2))) & 0xF));
    const uint8_t* qs = block.qs + 8 * ib;
    const int qh = block.qh[ib];
    for (int l = 0; l < 4; ++l) {
      const uint32_t signs = block.signs[4 * ib + l];
      int8_t* w = out.w + 32 * ib + 8 * l;
      const int first = qs[2 * l] | ((qh << (8 - 2 * l)) & 256);
      const int second = qs[2 * l + 1] | ((qh << (7 - 2 * l)) & 256);
      iq_bytes::signed_points(kIq3sGrid[size_t(first)], signs, 4, w);
      iq_bytes::signed_points(kIq3sGrid[size_t(second)], signs >> 4, 4, w + 4);
    }
  }
}

inline void iq_weights(const BlockIQ1_S& block, IqWeights& out) {
  const float d = f16_to_f32(block.d);
  for (int ib = 0; ib < 8; ++ib) {
    const uint16_t qh = iq_bytes::load_u16(block.qh + 2 * ib);
    out.scale[ib] = d * float(2 * ((qh >> 12) & 7) + 1) * 0.125f;
    for (int l = 0; l < 4; ++l) {
      const int index = block.qs[4 * ib + l] | (((qh >> (3 * l)) & 7) << 8);
      iq_bytes::shifted_points(kIq1sGrid[size_t(index)], qh & 0x8000, out.w + 32 * ib + 8 * l);
    }
  }
}

// IQ1_M's d: the top nibbles of its four scale words, lowest word first.
inline float iq1_m_d(const BlockIQ1_M& block) {
  uint16_t sc[4];
  std::memcpy(sc, block.scales, sizeof(sc));
  return f16_to_f32(uint16_t((sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) |
                             (sc[3] & 0xF000)));
}

inline void iq_weights(const BlockIQ1_M& block, IqWeights& out) {
  const float d = iq1_m_d(block);
  uint16_t sc[4];
  std::memcpy(sc, block.scales, sizeof(sc));
  for (int g = 0; g < 16; ++g) {
    // Scale 3 bits at 3 g within the 12 low bits of the words, g / 4 the word.
    const int s = (sc[g / 4] >> (3 * (g % 4))) & 7;
    out.scale[g] = d * float(2 * s + 1) * 0.125f;
  }
  for (int k = 0; k < 32; ++k) {
    const int qh = block.qh[k / 2] >> (4 * (k % 2));  // this point's nibble
    const int index = block.qs[k] | ((qh & 7) << 8);
    iq_bytes::shifted_points(kIq1sGrid[size_t(index)], qh & 8, out.w + 8 * k);
  }
}

}  // namespace
}  // namespace tandem

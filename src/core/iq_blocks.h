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
// Host and device (core/host_device.h): the CUDA kernels decode these blocks with the same
// functions (quant/block_decode.h), the grids read through iq_grid_point. Multi-byte fields are
// read byte by byte: blocks of 50 to 110 bytes sit at any even offset. The functions have
// internal linkage (as backends/cpu/kscales.h): files compiled for AVX-512 include this header,
// and the linker must not hand their copy to portable callers.
#include <cstddef>
#include <cstdint>

#include "core/blocks.h"
#include "core/dtype.h"
#include "core/host_device.h"
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

// The seven formats in one list, for the code that handles them alike (kernel tables, decoders):
// visit_iq_grid calls fn(IqFormat<Block, T>{}) for `type` and returns true, or returns false for
// any other format.
template <class B, DType T>
struct IqFormat {
  using Block = B;
  static constexpr DType kType = T;
};

inline constexpr DType kIqGridFormats[] = {DType::IQ1_S,  DType::IQ1_M,   DType::IQ2_XXS, DType::IQ2_XS,
                                           DType::IQ2_S,  DType::IQ3_XXS, DType::IQ3_S};

namespace {  // NOLINT(google-build-namespaces): internal linkage, see above

template <class Fn>
bool visit_iq_grid(DType type, Fn&& fn) {
  switch (type) {
    case DType::IQ1_S:
      fn(IqFormat<BlockIQ1_S, DType::IQ1_S>{});
      return true;
    case DType::IQ1_M:
      fn(IqFormat<BlockIQ1_M, DType::IQ1_M>{});
      return true;
    case DType::IQ2_XXS:
      fn(IqFormat<BlockIQ2_XXS, DType::IQ2_XXS>{});
      return true;
    case DType::IQ2_XS:
      fn(IqFormat<BlockIQ2_XS, DType::IQ2_XS>{});
      return true;
    case DType::IQ2_S:
      fn(IqFormat<BlockIQ2_S, DType::IQ2_S>{});
      return true;
    case DType::IQ3_XXS:
      fn(IqFormat<BlockIQ3_XXS, DType::IQ3_XXS>{});
      return true;
    case DType::IQ3_S:
      fn(IqFormat<BlockIQ3_S, DType::IQ3_S>{});
      return true;
    default:
      return false;
  }
}

constexpr bool is_iq_grid(DType type) {
  for (const DType grid : kIqGridFormats)
    if (grid == type) return true;
  return false;
}

}  // namespace

// A grid format's groups: one scale per kIqGroup<Block> weights.
template <class Block>
inline constexpr int kIqGroup = 32;
template <>
inline constexpr int kIqGroup<BlockIQ2_XS> = 16;
template <>
inline constexpr int kIqGroup<BlockIQ2_S> = 16;
template <>
inline constexpr int kIqGroup<BlockIQ1_M> = 16;

// The IQ1 formats' values are grid +- 1/8 (weights 8 * grid +- 1); the others' grid * sign.
template <class Block>
inline constexpr bool kIqShifted = false;
template <>
inline constexpr bool kIqShifted<BlockIQ1_S> = true;
template <>
inline constexpr bool kIqShifted<BlockIQ1_M> = true;

// 32 consecutive weights of a block (chunk k of 8) as their grid bytes and bits: what a SIMD
// kernel needs to build them in a register (four 64-bit inserts and a masked negate or add).
struct IqChunk {
  uint64_t points[4];  // weight 8 p + j in byte j of points[p]: the grid value (IQ1: -1, 0, 1)
  uint32_t flip = 0;   // bit i: weight i negative (IQ2, IQ3), or shifted by -1/8 instead of +1/8 (IQ1)
};

// A grid block's 256 weights and its scales, one per kIqGroup<Block> weights.
struct IqWeights {
  int8_t w[kQK_K];
  float scale[kQK_K / 16];
};

namespace {  // NOLINT(google-build-namespaces)
namespace iq_bytes {

// Four 7-bit sign indices (bits 0-27 of a word) as 32 sign bits.
TANDEM_HD uint32_t parity_signs(uint32_t word) {
  return iq_sign_byte(word & 127) | iq_sign_byte((word >> 7) & 127) << 8 |
         iq_sign_byte((word >> 14) & 127) << 16 | iq_sign_byte((word >> 21) & 127) << 24;
}

// Two 4-byte IQ3 points as one 8-byte word.
TANDEM_HD uint64_t point_pair(uint64_t first, uint64_t second) {
  return first | second << 32;
}

// d * (0.5 + s) * factor with s the 4-bit field at the bottom of `s`.
TANDEM_HD float half_step_scale(float d, uint32_t s, float factor) {
  return d * (0.5f + float(s & 0xF)) * factor;
}

}  // namespace iq_bytes

// ---- per format: group g's scale (iq_group_scale) and chunk k of 8 (iq_chunk) ----
// On the block's bytes (an IqTag<Block> says which format): decoders meet blocks at any byte
// offset, where a Block reference would be misaligned; the Block& forms below forward here.

template <class Block>
struct IqTag {};

// A field of the block at `p`: its bytes.
#define TANDEM_IQ_FIELD(Block, field) (p + offsetof(Block, field))

TANDEM_HD float iq_group_scale(IqTag<BlockIQ2_XXS>, const uint8_t* p, int g) {
  return iq_bytes::half_step_scale(hd::f16_to_f32(hd::load_u16(TANDEM_IQ_FIELD(BlockIQ2_XXS, d))),
                                   hd::load_u32(TANDEM_IQ_FIELD(BlockIQ2_XXS, qs) + 8 * g + 4) >> 28, 0.25f);
}

TANDEM_HD IqChunk iq_chunk(IqTag<BlockIQ2_XXS>, const uint8_t* p, int k) {
  const uint8_t* sub = TANDEM_IQ_FIELD(BlockIQ2_XXS, qs) + 8 * k;
  IqChunk chunk;
  for (int l = 0; l < 4; ++l) chunk.points[l] = iq_grid_point<IqGrid::Iq2xxs>(sub[l]);
  chunk.flip = iq_bytes::parity_signs(hd::load_u32(sub + 4));
  return chunk;
}

// IQ2_XS / IQ2_S: a 4-bit scale per 16 weights, two per byte, low nibble first.
TANDEM_HD float iq2_scale16(const uint8_t* d, const uint8_t* scales, int g) {
  return iq_bytes::half_step_scale(hd::f16_to_f32(hd::load_u16(d)), uint32_t(scales[g / 2] >> (4 * (g % 2))),
                                   0.25f);
}

TANDEM_HD float iq_group_scale(IqTag<BlockIQ2_XS>, const uint8_t* p, int g) {
  return iq2_scale16(TANDEM_IQ_FIELD(BlockIQ2_XS, d), TANDEM_IQ_FIELD(BlockIQ2_XS, scales), g);
}

TANDEM_HD IqChunk iq_chunk(IqTag<BlockIQ2_XS>, const uint8_t* p, int k) {
  IqChunk chunk;
  for (int l = 0; l < 4; ++l) {
    const uint16_t word = hd::load_u16(TANDEM_IQ_FIELD(BlockIQ2_XS, qs) + 8 * k + 2 * l);
    chunk.points[l] = iq_grid_point<IqGrid::Iq2xs>(word & 511);
    chunk.flip |= iq_sign_byte(word >> 9) << (8 * l);
  }
  return chunk;
}

TANDEM_HD float iq_group_scale(IqTag<BlockIQ2_S>, const uint8_t* p, int g) {
  return iq2_scale16(TANDEM_IQ_FIELD(BlockIQ2_S, d), TANDEM_IQ_FIELD(BlockIQ2_S, scales), g);
}

TANDEM_HD IqChunk iq_chunk(IqTag<BlockIQ2_S>, const uint8_t* p, int k) {
  const uint8_t* qs = TANDEM_IQ_FIELD(BlockIQ2_S, qs);
  const uint32_t qh = TANDEM_IQ_FIELD(BlockIQ2_S, qh)[k];
  IqChunk chunk;
  for (int l = 0; l < 4; ++l)
    chunk.points[l] = iq_grid_point<IqGrid::Iq2s>(qs[4 * k + l] | ((qh << (8 - 2 * l)) & 0x300));
  chunk.flip = hd::load_u32(qs + 32 + 4 * k);  // the signs, one bit a weight
  return chunk;
}

TANDEM_HD float iq_group_scale(IqTag<BlockIQ3_XXS>, const uint8_t* p, int g) {
  return iq_bytes::half_step_scale(hd::f16_to_f32(hd::load_u16(TANDEM_IQ_FIELD(BlockIQ3_XXS, d))),
                                   hd::load_u32(TANDEM_IQ_FIELD(BlockIQ3_XXS, qs) + 64 + 4 * g) >> 28, 0.5f);
}

TANDEM_HD IqChunk iq_chunk(IqTag<BlockIQ3_XXS>, const uint8_t* p, int k) {
  const uint8_t* qs = TANDEM_IQ_FIELD(BlockIQ3_XXS, qs);
  IqChunk chunk;
  for (int l = 0; l < 4; ++l)
    chunk.points[l] = iq_bytes::point_pair(iq_grid_point<IqGrid::Iq3xxs>(qs[8 * k + 2 * l]),
                                           iq_grid_point<IqGrid::Iq3xxs>(qs[8 * k + 2 * l + 1]));
  chunk.flip = iq_bytes::parity_signs(hd::load_u32(qs + 64 + 4 * k));
  return chunk;
}

TANDEM_HD float iq_group_scale(IqTag<BlockIQ3_S>, const uint8_t* p, int g) {
  const uint32_t s = (TANDEM_IQ_FIELD(BlockIQ3_S, scales)[g / 2] >> (4 * (g % 2))) & 0xF;
  return hd::f16_to_f32(hd::load_u16(TANDEM_IQ_FIELD(BlockIQ3_S, d))) * float(1 + 2 * s);
}

TANDEM_HD IqChunk iq_chunk(IqTag<BlockIQ3_S>, const uint8_t* p, int k) {
  const uint8_t* qs = TANDEM_IQ_FIELD(BlockIQ3_S, qs) + 8 * k;
  const uint32_t qh = TANDEM_IQ_FIELD(BlockIQ3_S, qh)[k];
  IqChunk chunk;
  for (int l = 0; l < 4; ++l) {
    const uint32_t first = qs[2 * l] | ((qh << (8 - 2 * l)) & 256);
    const uint32_t second = qs[2 * l + 1] | ((qh << (7 - 2 * l)) & 256);
    chunk.points[l] = iq_bytes::point_pair(iq_grid_point<IqGrid::Iq3s>(first),
                                           iq_grid_point<IqGrid::Iq3s>(second));
  }
  chunk.flip = hd::load_u32(TANDEM_IQ_FIELD(BlockIQ3_S, signs) + 4 * k);  // one bit a weight
  return chunk;
}

TANDEM_HD float iq_group_scale(IqTag<BlockIQ1_S>, const uint8_t* p, int g) {
  const uint32_t qh = hd::load_u16(TANDEM_IQ_FIELD(BlockIQ1_S, qh) + 2 * g);
  return hd::f16_to_f32(hd::load_u16(TANDEM_IQ_FIELD(BlockIQ1_S, d))) * float(2 * ((qh >> 12) & 7) + 1) *
         0.125f;
}

TANDEM_HD IqChunk iq_chunk(IqTag<BlockIQ1_S>, const uint8_t* p, int k) {
  const uint8_t* qs = TANDEM_IQ_FIELD(BlockIQ1_S, qs);
  const uint32_t qh = hd::load_u16(TANDEM_IQ_FIELD(BlockIQ1_S, qh) + 2 * k);
  IqChunk chunk;
  for (int l = 0; l < 4; ++l)
    chunk.points[l] = iq_grid_point<IqGrid::Iq1s>(qs[4 * k + l] | (((qh >> (3 * l)) & 7) << 8));
  chunk.flip = qh & 0x8000 ? ~0u : 0u;  // one shift sign for the 32
  return chunk;
}

// IQ1_M's scale words: 3-bit scales in their low 12 bits, d's nibbles on top.
TANDEM_HD uint32_t iq1_m_word(const uint8_t* p, int w) {
  return hd::load_u16(TANDEM_IQ_FIELD(BlockIQ1_M, scales) + 2 * w);
}

// IQ1_M's d: the top nibbles of its four scale words, lowest word first.
TANDEM_HD float iq1_m_d(const uint8_t* p) {
  return hd::f16_to_f32(uint16_t((iq1_m_word(p, 0) >> 12) | ((iq1_m_word(p, 1) >> 8) & 0x00F0) |
                                 ((iq1_m_word(p, 2) >> 4) & 0x0F00) | (iq1_m_word(p, 3) & 0xF000)));
}

// Group g's 3-bit scale: bits 3 (g % 4) of word g / 4.
TANDEM_HD float iq1_m_scale(const uint8_t* p, float d, int g) {
  return d * float(2 * ((iq1_m_word(p, g / 4) >> (3 * (g % 4))) & 7) + 1) * 0.125f;
}

TANDEM_HD float iq_group_scale(IqTag<BlockIQ1_M>, const uint8_t* p, int g) {
  return iq1_m_scale(p, iq1_m_d(p), g);
}

TANDEM_HD IqChunk iq_chunk(IqTag<BlockIQ1_M>, const uint8_t* p, int k) {
  const uint8_t* qs = TANDEM_IQ_FIELD(BlockIQ1_M, qs);
  const uint8_t* qh = TANDEM_IQ_FIELD(BlockIQ1_M, qh);
  IqChunk chunk;
  for (int l = 0; l < 4; ++l) {
    const uint32_t nibble = qh[2 * k + l / 2] >> (4 * (l % 2));  // this point's nibble
    chunk.points[l] = iq_grid_point<IqGrid::Iq1s>(qs[4 * k + l] | ((nibble & 7) << 8));
    chunk.flip |= ((nibble >> 3) & 1) * (0xFFu << (8 * l));  // a shift sign per 8, no branch
  }
  return chunk;
}

#undef TANDEM_IQ_FIELD

// The same on a Block (the CPU kernels' arrays of blocks, aligned).
template <class Block>
TANDEM_HD float iq_group_scale(const Block& block, int g) {
  return iq_group_scale(IqTag<Block>{}, reinterpret_cast<const uint8_t*>(&block), g);
}

template <class Block>
TANDEM_HD IqChunk iq_chunk(const Block& block, int k) {
  return iq_chunk(IqTag<Block>{}, reinterpret_cast<const uint8_t*>(&block), k);
}

// ---- every format ----

// Weight i (0-31) of a chunk: grid * sign, or 8 * grid +- 1 for IQ1.
template <class Block>
TANDEM_HD int iq_chunk_weight(const IqChunk& chunk, int i) {
  const int v = int(int8_t((chunk.points[i / 8] >> (8 * (i % 8))) & 0xFF));
  const bool flip = (chunk.flip >> i) & 1;
  if constexpr (kIqShifted<Block>) {
    return 8 * v + (flip ? -1 : 1);
  } else {
    return flip ? -v : v;
  }
}

template <class Block>
TANDEM_HD void iq_chunk_weights(const IqChunk& chunk, int8_t* w) {
  for (int i = 0; i < 32; ++i) w[i] = int8_t(iq_chunk_weight<Block>(chunk, i));
}

template <class Block>
TANDEM_HD void iq_scales(const Block& block, float* scale) {
  for (int g = 0; g < kQK_K / kIqGroup<Block>; ++g) scale[g] = iq_group_scale(block, g);
}

// IQ1_M's with its d assembled once, not once per group.
TANDEM_HD void iq_scales(const BlockIQ1_M& block, float* scale) {
  const auto* p = reinterpret_cast<const uint8_t*>(&block);
  const float d = iq1_m_d(p);
  for (int g = 0; g < 16; ++g) scale[g] = iq1_m_scale(p, d, g);
}

template <class Block>
TANDEM_HD void iq_weights(const Block& block, IqWeights& out) {
  iq_scales(block, out.scale);
  for (int k = 0; k < 8; ++k) iq_chunk_weights<Block>(iq_chunk(block, k), out.w + 32 * k);
}

}  // namespace
}  // namespace tandem

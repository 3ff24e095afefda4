#pragma once
// Internal to the AVX-512 kernel files: IQ2_XXS and IQ3_XXS, the grid formats of most low-bit
// experts (UD-IQ1_S's downs, UD-IQ2_XXS's gate/up and downs), with their 256-point grids in
// registers, 64 weights (a pair of 32-weight chunks) at a time.
//
// Each grid point is 8 (IQ2_XXS) or 4 (IQ3_XXS) level indices of 2 or 3 bits: a 16-bit code, the
// 256 codes 8 zmm. A block's point indices are looked up 32 at once (four vpermi2w of 64 entries
// each, then the index's two top bits choose). A pair's 8 or 16 codes become its 64 grid bytes by
// a vpermw (the codes of each 8 weights to their qword), a vpmultishiftqb (byte j: the code's
// bits from field j up) and a vpermb into the levels (it reads the low 6 bits only, and its table
// repeats the levels every 4 or 8 entries, so the bits above each field do not matter).
//
// Signs: per 32 weights a word of four 7-bit fields, one per 8 weights, the eighth sign making
// their count even (kIqSigns' rule), and the chunk's 4-bit scale s on top.
#include <array>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backends/cpu/avx512_intrinsics.h"
#include "core/iq_blocks.h"

namespace tandem::cpu {
namespace {  // NOLINT(google-build-namespaces)

template <class Block>
struct XxsFormat;

template <>
struct XxsFormat<BlockIQ2_XXS> {
  static constexpr int kPointElems = 8;
  static constexpr int kFieldBits = 2;
  static constexpr int kLevels[3] = {8, 25, 43};
  static constexpr float kFactor = 0.25f;  // the chunk's scale is d * (0.5 + s) * kFactor
  static constexpr const auto& kGrid = kIq2xxsGrid;
  // Chunk k: 4 index bytes at qs[8k], its signs word at qs[8k + 4].
  static const uint8_t* signs_word(const BlockIQ2_XXS& block, int k) { return block.qs + 8 * k + 4; }
};

template <>
struct XxsFormat<BlockIQ3_XXS> {
  static constexpr int kPointElems = 4;
  static constexpr int kFieldBits = 3;
  static constexpr int kLevels[8] = {4, 12, 20, 28, 36, 44, 52, 62};
  static constexpr float kFactor = 0.5f;
  static constexpr const auto& kGrid = kIq3xxsGrid;
  // Chunk k: 8 index bytes at qs[8k], its signs word at qs[64 + 4k].
  static const uint8_t* signs_word(const BlockIQ3_XXS& block, int k) { return block.qs + 64 + 4 * k; }
};

template <class Block>
constexpr std::array<uint16_t, 256> xxs_codes() {
  using F = XxsFormat<Block>;
  std::array<uint16_t, 256> codes{};
  for (size_t k = 0; k < 256; ++k) {
    for (int j = 0; j < F::kPointElems; ++j) {
      const int v = int((uint64_t(F::kGrid[k]) >> (8 * j)) & 0xFF);
      int level = 0;
      while (F::kLevels[level] != v) ++level;
      codes[k] = uint16_t(codes[k] | level << (F::kFieldBits * j));
    }
  }
  return codes;
}

template <class Block>
alignas(64) inline constexpr std::array<uint16_t, 256> kXxsCodes = xxs_codes<Block>();

struct XxsGrid {
  __m512i codes[8];  // point k's code at word k % 32 of codes[k / 32]
};

template <class Block>
inline XxsGrid xxs_grid() {
  XxsGrid grid;
  for (int t = 0; t < 8; ++t) grid.codes[t] = _mm512_load_si512(kXxsCodes<Block>.data() + 32 * t);
  return grid;
}

// The codes of 32 point indices (bytes, widened to words).
inline __m512i xxs_lookup(const XxsGrid& grid, __m256i index_bytes) {
  const __m512i index = _mm512_cvtepu8_epi16(index_bytes);
  const __m512i c0 = _mm512_permutex2var_epi16(grid.codes[0], index, grid.codes[1]);
  const __m512i c1 = _mm512_permutex2var_epi16(grid.codes[2], index, grid.codes[3]);
  const __m512i c2 = _mm512_permutex2var_epi16(grid.codes[4], index, grid.codes[5]);
  const __m512i c3 = _mm512_permutex2var_epi16(grid.codes[6], index, grid.codes[7]);
  const __mmask32 bit6 = _mm512_test_epi16_mask(index, _mm512_set1_epi16(64));
  const __mmask32 bit7 = _mm512_test_epi16_mask(index, _mm512_set1_epi16(128));
  return _mm512_mask_mov_epi16(_mm512_mask_mov_epi16(c0, bit6, c1), bit7,
                               _mm512_mask_mov_epi16(c2, bit6, c3));
}

// A block's point codes in order: IQ2_XXS's 32 in codes[0], IQ3_XXS's 64 in codes[0..1].
struct XxsBlockCodes {
  __m512i codes[2];
};

template <class Block>
inline XxsBlockCodes xxs_block_codes(const Block& block, const XxsGrid& grid) {
  XxsBlockCodes out;
  if constexpr (std::is_same_v<Block, BlockIQ2_XXS>) {
    // The index bytes are the even dwords of qs (the odd ones are the signs words).
    const __m512i even = _mm512_permutexvar_epi32(
        _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 0, 0, 0, 0, 0, 0, 0), _mm512_loadu_si512(block.qs));
    out.codes[0] = xxs_lookup(grid, _mm512_castsi512_si256(even));
    out.codes[1] = out.codes[0];
  } else {
    out.codes[0] = xxs_lookup(grid, load256(block.qs));
    out.codes[1] = xxs_lookup(grid, load256(block.qs + 32));
  }
  return out;
}

// The 64 unsigned grid bytes of chunks 2p and 2p + 1.
template <class Block>
inline __m512i xxs_pair_points(const XxsBlockCodes& block, int p) {
  if constexpr (std::is_same_v<Block, BlockIQ2_XXS>) {
    // Qword q (weights 8q ..) takes code 8p + q; byte j its bits 2j and up.
    const __m512i spread = _mm512_add_epi16(
        _mm512_set_epi16(7, 7, 7, 7, 6, 6, 6, 6, 5, 5, 5, 5, 4, 4, 4, 4, 3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1,
                         0, 0, 0, 0),
        _mm512_set1_epi16(short(8 * p)));
    const __m512i fields = _mm512_multishift_epi64_epi8(_mm512_set1_epi64(int64_t(0x0E0C0A0806040200)),
                                                        _mm512_permutexvar_epi16(spread, block.codes[0]));
    return _mm512_permutexvar_epi8(fields, _mm512_set1_epi32(0x002B1908));  // 8, 25, 43, -
  } else {
    // Qword q takes codes 2q and 2q + 1 of the pair (words 0 and 1); bytes 0-3 the first's 3-bit
    // fields, bytes 4-7 the second's.
    const __m512i spread = _mm512_add_epi16(
        _mm512_set_epi16(15, 14, 15, 14, 13, 12, 13, 12, 11, 10, 11, 10, 9, 8, 9, 8, 7, 6, 7, 6, 5, 4, 5, 4,
                         3, 2, 3, 2, 1, 0, 1, 0),
        _mm512_set1_epi16(short(16 * (p % 2))));
    const __m512i fields = _mm512_multishift_epi64_epi8(_mm512_set1_epi64(int64_t(0x1916131009060300)),
                                                        _mm512_permutexvar_epi16(spread, block.codes[p / 2]));
    return _mm512_permutexvar_epi8(fields, _mm512_set1_epi64(int64_t(0x3E342C241C140C04)));
  }
}

// The 64 sign bits of chunks 2p and 2p + 1 (bit i set: weight i negative): pdep spreads the
// 7-bit fields to the low 7 bits of 8 bytes, and the xor-folds leave each byte's parity in its
// bit 0 (bits shifted in from the next byte only reach bits above the ones read).
template <class Block>
inline __mmask64 xxs_pair_signs(const Block& block, int p) {
  uint32_t first, second;
  std::memcpy(&first, XxsFormat<Block>::signs_word(block, 2 * p), sizeof(first));
  std::memcpy(&second, XxsFormat<Block>::signs_word(block, 2 * p + 1), sizeof(second));
  const uint64_t fields = uint64_t(first & 0x0FFFFFFF) | uint64_t(second & 0x0FFFFFFF) << 28;
  const uint64_t bytes = _pdep_u64(fields, 0x7F7F7F7F7F7F7F7Full);
  uint64_t parity = bytes ^ (bytes >> 4);
  parity ^= parity >> 2;
  parity ^= parity >> 1;
  return __mmask64(bytes | (parity & 0x0101010101010101ull) << 7);
}

// The chunks' scales, d * (0.5 + s) * kFactor, in lanes: chunk k's in lane xxs_scale_lane(k).
template <class Block>
constexpr int xxs_scale_lane(int k) {
  return std::is_same_v<Block, BlockIQ2_XXS> ? 2 * k + 1 : k;  // IQ2_XXS: the odd dwords of qs
}

template <class Block>
inline __m512 xxs_block_scales(const Block& block, float d) {
  const __m512i words = std::is_same_v<Block, BlockIQ2_XXS>
                            ? _mm512_loadu_si512(block.qs)
                            : _mm512_castsi256_si512(load256(XxsFormat<Block>::signs_word(block, 0)));
  const __m512 s = _mm512_cvtepi32_ps(_mm512_srli_epi32(words, 28));
  return _mm512_mul_ps(_mm512_add_ps(s, _mm512_set1_ps(0.5f)), _mm512_set1_ps(XxsFormat<Block>::kFactor * d));
}

// Chunk 2p's scale in lanes 0-7 and chunk 2p + 1's in lanes 8-15 (the lanes vpdpbusd fills for
// them).
template <class Block>
inline __m512 xxs_pair_scales(__m512 block_scales, int p) {
  const int a = xxs_scale_lane<Block>(2 * p), b = xxs_scale_lane<Block>(2 * p + 1);
  return _mm512_permutexvar_ps(_mm512_setr_epi32(a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b),
                               block_scales);
}

}  // namespace
}  // namespace tandem::cpu

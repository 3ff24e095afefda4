#pragma once
// <immintrin.h> for the AVX-512 kernel files, and the small helpers they share (unaligned loads,
// nibble unpacking, broadcasts, software prefetch). GCC 12's
// AVX-512 intrinsics start several results from an "undefined" vector that its own
// -Wuninitialized then flags (GCC bug 105593, fixed in 13); the warnings point into the header,
// so silencing them around the include hides nothing of ours.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include <array>
#include <cstdint>
#include <cstring>

#include "core/blocks.h"
#include "core/iq_blocks.h"

// Internal linkage, as act_q16.h: only the AVX-512 files include this.
namespace tandem::cpu {
namespace {  // NOLINT(google-build-namespaces)

inline __m256i load256(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

inline __m128i load128(const void* p) {
  return _mm_loadu_si128(static_cast<const __m128i*>(p));
}

// The 32 nibbles of 16 bytes as bytes in element order: element j in the low nibble of byte j,
// element j + 16 in the high one (the layout of Q4_0, Q5_0, IQ4_NL and IQ4_XS sub-blocks).
inline __m256i unpack_nibbles_32(const uint8_t* qs) {
  const __m128i v = load128(qs);
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(15));
}

// Four bytes (two int16 weights, or four 8-bit ones) broadcast to every 32-bit lane: the weight
// operand of the token-lanes kernels' vpdpwssd / vpdpbusd.
inline __m512i broadcast_4_bytes(const void* p) {
  int32_t word;
  std::memcpy(&word, p, sizeof(word));
  return _mm512_set1_epi32(word);
}

// Software prefetch this far ahead of the weights being read. A decode matmul streams its
// weights once from DRAM, and the hardware prefetchers alone keep too few reads in flight on
// this kind of machine: the Q4_K_R16 kernel went from 33 to 41-47 GB/s on one core and from
// 45 to 51-53 GB/s on two (8 KiB ahead; 1 KiB ahead gained a sixth of that). Past the end of the matrix
// the prefetches touch memory nobody reads: harmless, prefetches never fault.
constexpr int kPrefetchAhead = 8192;

inline void prefetch_ahead(const void* p, int bytes) {
  const char* ahead = static_cast<const char*>(p) + kPrefetchAhead;
  for (int line = 0; line < bytes; line += 64) _mm_prefetch(ahead + line, _MM_HINT_T0);
}

// ---- the ternary formats: group k (32 weights) of a 256-block as 32 int16 quants q (0..2) ----

// TQ2_0: group k of a half is bits 2k, 2k + 1 of its 32 bytes.
inline __m512i tq2_0_group(const BlockTQ2_0& block, int k) {
  const __m512i bytes = _mm512_cvtepu8_epi16(load256(block.qs + 32 * (k / 4)));
  return _mm512_and_si512(_mm512_srl_epi16(bytes, _mm_cvtsi32_si128(2 * (k % 4))),
                          _mm512_set1_epi16(3));
}

// TQ1_0: digit n of byte b is ((b · 3^n) mod 256) · 3 >> 8 (core/blocks.h), on 16-bit lanes: a
// multiply, a mask, and the high half of a multiply by 3 · 256. Group k's bytes and multipliers:
// groups 0-4 digit k of qs[0..31]; 5 and 6 two digits each of qs[32..47]; 7 digit 4 of
// qs[32..47] and the four digits of qh[0..3] (element 240 + 4 n + m: digit n of qh[m]).
inline __m512i tq1_0_group(const BlockTQ1_0& block, int k) {
  alignas(64) static constexpr int16_t kPow3[3][32] = {
      {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3,
       3, 3},
      {9,  9,  9,  9,  9,  9,  9,  9,  9,  9,  9,  9,  9,  9,  9,  9,
       27, 27, 27, 27, 27, 27, 27, 27, 27, 27, 27, 27, 27, 27, 27, 27},
      {81, 81, 81, 81, 81, 81, 81, 81, 81, 81, 81, 81, 81, 81, 81, 81,
       1,  1,  1,  1,  3,  3,  3,  3,  9,  9,  9,  9,  27, 27, 27, 27}};
  constexpr int16_t kDigit[5] = {1, 3, 9, 27, 81};
  __m512i bytes, pow3;
  if (k < 5) {
    bytes = _mm512_cvtepu8_epi16(load256(block.qs));
    pow3 = _mm512_set1_epi16(kDigit[k]);
  } else if (k < 7) {
    bytes = _mm512_cvtepu8_epi16(_mm256_broadcastsi128_si256(load128(block.qs + 32)));
    pow3 = _mm512_load_si512(kPow3[k - 5]);
  } else {
    uint32_t qh;
    std::memcpy(&qh, block.qh, sizeof(qh));
    const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(load128(block.qs + 32)),
                                                 _mm_set1_epi32(int32_t(qh)), 1);
    bytes = _mm512_cvtepu8_epi16(both);
    pow3 = _mm512_load_si512(kPow3[2]);
  }
  const __m512i low = _mm512_and_si512(_mm512_mullo_epi16(bytes, pow3), _mm512_set1_epi16(255));
  return _mm512_mulhi_epu16(low, _mm512_set1_epi16(3 * 256));
}

// The 32 weights of a grid i-quant chunk (core/iq_blocks.h) as signed bytes: the four grid
// words inserted, then the signs by one masked negate (IQ2, IQ3), or for IQ1 8 * grid (vpsignb
// of 8 by the grid's -1, 0, 1) plus or minus 1 by one masked subtract.
template <class Block>
inline __m256i iq_chunk_bytes(const IqChunk& chunk);

// IQ2_XXS, the format the low-bit files use most, with its grid in registers. Each grid point
// is 8 level indices (0, 1, 2 for 8, 25, 43) of 2 bits: 16 bits a point, the 256 points 8 zmm.
// A block's 32 indices are looked up in them at once (four vpermi2w of 64 entries each, then the
// index's top two bits choose), and a pair of chunks' 8 codes become their 64 grid bytes by a
// vpermw (code q to qword q), a vpmultishiftqb (byte j: the code's bits 2j and up) and a vpermb
// into the levels (its index is the low 6 bits, so the bits above each field do not matter).
struct Iq2xxsGrid {
  __m512i codes[8];  // point k's 16-bit code at word k % 32 of codes[k / 32]
};

constexpr std::array<uint16_t, 256> iq2_xxs_codes() {
  std::array<uint16_t, 256> codes{};
  for (size_t k = 0; k < 256; ++k) {
    for (int j = 0; j < 8; ++j) {
      const int v = int((kIq2xxsGrid[k] >> (8 * j)) & 0xFF);
      codes[k] = uint16_t(codes[k] | (v == 8 ? 0 : v == 25 ? 1 : 2) << (2 * j));
    }
  }
  return codes;
}
alignas(64) inline constexpr std::array<uint16_t, 256> kIq2xxsCodes = iq2_xxs_codes();

inline Iq2xxsGrid iq2_xxs_grid() {
  Iq2xxsGrid grid;
  for (int t = 0; t < 8; ++t) grid.codes[t] = _mm512_load_si512(kIq2xxsCodes.data() + 32 * t);
  return grid;
}

// The 32 codes of a block's points, chunk k's four at words 4k .. 4k + 3.
inline __m512i iq2_xxs_block_codes(const BlockIQ2_XXS& block, const Iq2xxsGrid& grid) {
  // The index bytes are the even dwords of qs (the odd ones are the signs words).
  const __m512i qs = _mm512_loadu_si512(block.qs);
  const __m512i even = _mm512_permutexvar_epi32(
      _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 0, 0, 0, 0, 0, 0, 0), qs);
  const __m512i index = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(even));
  const __m512i c0 = _mm512_permutex2var_epi16(grid.codes[0], index, grid.codes[1]);
  const __m512i c1 = _mm512_permutex2var_epi16(grid.codes[2], index, grid.codes[3]);
  const __m512i c2 = _mm512_permutex2var_epi16(grid.codes[4], index, grid.codes[5]);
  const __m512i c3 = _mm512_permutex2var_epi16(grid.codes[6], index, grid.codes[7]);
  const __mmask32 bit6 = _mm512_test_epi16_mask(index, _mm512_set1_epi16(64));
  const __mmask32 bit7 = _mm512_test_epi16_mask(index, _mm512_set1_epi16(128));
  return _mm512_mask_mov_epi16(_mm512_mask_mov_epi16(c0, bit6, c1), bit7,
                               _mm512_mask_mov_epi16(c2, bit6, c3));
}

// The 64 unsigned grid bytes (8, 25, 43) of chunks 2p and 2p + 1, from the block's codes.
inline __m512i iq2_xxs_pair_points(__m512i codes, int p) {
  const __m512i code_per_qword = _mm512_permutexvar_epi16(
      _mm512_add_epi16(_mm512_set_epi16(7, 7, 7, 7, 6, 6, 6, 6, 5, 5, 5, 5, 4, 4, 4, 4, 3, 3, 3, 3, 2,
                                        2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
                       _mm512_set1_epi16(short(8 * p))),
      codes);
  const __m512i fields = _mm512_multishift_epi64_epi8(
      _mm512_set1_epi64(int64_t(0x0E0C0A0806040200)), code_per_qword);
  // Level i & 3 at every index i < 64: 8, 25, 43 (and 0 for the unused 3).
  const __m512i levels = _mm512_set1_epi32(0x002B1908);
  return _mm512_permutexvar_epi8(fields, levels);
}

// The 64 sign bits of chunks 2p and 2p + 1 (bit i set: weight i negative). Each chunk's signs
// word holds four 7-bit fields, one per 8 weights; the eighth sign of each 8 makes their count
// even (kIqSigns' rule): pdep spreads the fields to the low 7 bits of 8 bytes, and the
// xor-folds leave each byte's parity in its bit 0 (bits shifted in from the next byte only
// reach bits above the ones read).
inline __mmask64 iq2_xxs_pair_signs(const BlockIQ2_XXS& block, int p) {
  uint32_t words[4];
  std::memcpy(words, block.qs + 16 * p, sizeof(words));  // indices, signs, indices, signs
  const uint64_t fields = uint64_t(words[1] & 0x0FFFFFFF) | uint64_t(words[3] & 0x0FFFFFFF) << 28;
  const uint64_t bytes = _pdep_u64(fields, 0x7F7F7F7F7F7F7F7Full);
  uint64_t parity = bytes ^ (bytes >> 4);
  parity ^= parity >> 2;
  parity ^= parity >> 1;
  return __mmask64(bytes | (parity & 0x0101010101010101ull) << 7);
}

// The chunks' scales over the block's d, (0.5 + s) / 4 with s the top 4 bits of each signs
// word, times `d`: chunk k's in lane 2k + 1.
inline __m512 iq2_xxs_block_scales(const BlockIQ2_XXS& block, float d) {
  const __m512i s = _mm512_srli_epi32(_mm512_loadu_si512(block.qs), 28);
  return _mm512_mul_ps(_mm512_add_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(0.5f)),
                       _mm512_set1_ps(0.25f * d));
}

// Chunk 2p's scale in lanes 0-7 and chunk 2p + 1's in lanes 8-15 (the lanes vpdpbusd fills for
// them), from iq2_xxs_block_scales.
inline __m512 iq2_xxs_pair_scales(__m512 block_scales, int p) {
  const __m512i lanes = _mm512_add_epi32(
      _mm512_setr_epi32(1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3), _mm512_set1_epi32(4 * p));
  return _mm512_permutexvar_ps(lanes, block_scales);
}

template <class Block>
inline __m256i iq_chunk_bytes(const IqChunk& chunk) {
  const __m256i points = _mm256_set_epi64x(int64_t(chunk.points[3]), int64_t(chunk.points[2]),
                                           int64_t(chunk.points[1]), int64_t(chunk.points[0]));
  if constexpr (kIqShifted<Block>) {
    const __m256i eights = _mm256_sign_epi8(_mm256_set1_epi8(8), points);
    const __m256i one = _mm256_set1_epi8(1);
    return _mm256_mask_sub_epi8(_mm256_add_epi8(eights, one), __mmask32(chunk.flip), eights, one);
  }
  return _mm256_mask_sub_epi8(points, __mmask32(chunk.flip), _mm256_setzero_si256(), points);
}

}  // namespace
}  // namespace tandem::cpu

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

// Sixteen f16 values as floats.
inline __m512 half_to_float(const uint16_t* p) {
  return _mm512_cvtph_ps(load256(p));
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

// The next rows of a many-token product, requested before this row block's tiles are computed:
// the unpacking of a row block read its weights from DRAM with nothing else in flight (the load
// stalls were most of its time, 8% of a 512-token prompt), while the tiles that follow run long
// enough to hide the next block's reads.
inline void prefetch_rows(const void* p, size_t bytes) {
  for (size_t line = 0; line < bytes; line += 64)
    _mm_prefetch(static_cast<const char*>(p) + line, _MM_HINT_T1);
}

// e^x, 16 at a time: 2^n e^r with n = round(x / ln 2) and |r| <= ln 2 / 2 (ln 2 in two parts, so
// r is exact to a float), e^r by its Taylor series to r^7 (truncation below 6e-9 relative:
// within a float's rounding). x is clamped to [-104, 89]: below, the result is 0 or a denormal
// either way; above, infinity either way (scalef overflows); the clamp keeps infinities out of
// the reduction (inf - inf). A NaN stays NaN (max and min return their second operand when one
// is NaN, so x goes second). Within a few float roundings of exp (tested against double).
inline __m512 exp_avx512(__m512 x) {
  x = _mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-104.0f), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);   // ln 2, high bits
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860682030941723212e-6f), r);  // ln 2, the rest
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  for (const float c : {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f})
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
  return _mm512_scalef_ps(p, n);
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

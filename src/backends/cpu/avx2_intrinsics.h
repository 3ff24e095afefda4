#pragma once
// Helpers the AVX2 kernel files share (compiled with -mavx2 -mfma -mf16c; internal linkage, as
// avx512_intrinsics.h, so that no other file gets their AVX2 code).
#include <immintrin.h>

#include <cstdint>

#include "core/iq_blocks.h"

namespace tandem::cpu {
namespace {  // NOLINT(google-build-namespaces)

// Byte i = 0xFF where bit i of `bits` is set.
inline __m256i bits_to_bytes(uint32_t bits) {
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(int(bits)), _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101,
                                                       0x0202020202020202, 0x0303030303030303));
  const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201));
  return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
}

// A grid i-quant chunk's four grid words (core/iq_blocks.h) as 32 bytes, unsigned for IQ2 and
// IQ3 (the signs are applied where they are cheapest), -1, 0, 1 for IQ1.
inline __m256i iq_chunk_points(const IqChunk& chunk) {
  return _mm256_set_epi64x(int64_t(chunk.points[3]), int64_t(chunk.points[2]),
                           int64_t(chunk.points[1]), int64_t(chunk.points[0]));
}

// A chunk's 32 weights as signed bytes: the flip bits as bytes m, then (w ^ m) - m (a negate
// where m is set), or for IQ1 8 * grid (vpsignb) plus m | 1 (-1 or +1).
template <class Block>
inline __m256i iq_chunk_bytes(const IqChunk& chunk) {
  const __m256i points = iq_chunk_points(chunk);
  const __m256i m = bits_to_bytes(chunk.flip);
  if constexpr (kIqShifted<Block>) {
    return _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), points),
                           _mm256_or_si256(m, _mm256_set1_epi8(1)));
  }
  return _mm256_sub_epi8(_mm256_xor_si256(points, m), m);
}

}  // namespace
}  // namespace tandem::cpu

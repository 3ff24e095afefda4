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

}  // namespace
}  // namespace tandem::cpu

#pragma once
// <immintrin.h> for the AVX-512 kernel files, and the software prefetch they share. GCC 12's
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

// Internal linkage, as act_q16.h: only the AVX-512 files include this.
namespace tandem::cpu {
namespace {  // NOLINT(google-build-namespaces)

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

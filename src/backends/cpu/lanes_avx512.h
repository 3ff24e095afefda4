#pragma once
// Internal to the CPU backend's AVX-512 token-lanes files (gemm_q16_avx512.cpp,
// gemm_q8_avx512.cpp): what their products share once the integer work is done.
#include "backends/cpu/avx512_intrinsics.h"

#include <algorithm>
#include <cstdint>

#include "backends/cpu/gemm_q16.h"
#include "backends/cpu/kernels.h"

namespace tandem::cpu {
namespace {  // NOLINT(google-build-namespaces): each including file gets its own copy

// out[r][k], lane t: the result of row `row + r` for token `first + 16 k + t`; stored to
// m.output for the tokens that exist (the last tile's missing lanes are dropped).
template <int kRows, int kTiles>
inline void store_lanes(const LanesMatmul& m, const __m512 (*out)[kTiles], int64_t row,
                        int64_t first) {
  for (int k = 0; k < kTiles; ++k) {
    alignas(64) float lanes[kRows][kLanes];
    for (int r = 0; r < kRows; ++r) _mm512_store_ps(lanes[r], out[r][k]);
    const int64_t tile_first = first + k * kLanes;
    const int64_t n = std::min<int64_t>(kLanes, m.n_tokens - tile_first);
    for (int64_t t = 0; t < n; ++t)
      for (int r = 0; r < kRows; ++r) m.output[(tile_first + t) * m.rows + row + r] = lanes[r][t];
  }
}

}  // namespace
}  // namespace tandem::cpu

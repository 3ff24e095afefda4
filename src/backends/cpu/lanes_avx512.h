#pragma once
// Internal to the CPU backend's AVX-512 token-lanes files (gemm_q16_avx512.cpp,
// gemm_q8_avx512.cpp): the order in which sixteen unpacked rows meet the tiles, and the store of
// the results.
#include "backends/cpu/avx512_intrinsics.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

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

inline size_t partial_sums_bytes(int64_t n_tokens) {
  return size_t((n_tokens + kLanes - 1) / kLanes) * 16 * sizeof(__m512);
}

// Sixteen unpacked rows (`row` ..) against every tile of `m`, kChunkCols columns at a time: the
// chunk's weights (16 rows x 512 columns at 8 bits: 8 KiB, or 256 at 16 bits) and a pair of
// tiles' chunk (~24 KiB with their scales and sums) stay in L1 while four sets of four rows pass
// over them, so each tile comes from L2 or L3 once for the 16 rows. Four rows at a time over all
// columns reread every tile for each set of four: a 512-token prompt's 32 tiles of 2048 columns
// (1.5 MiB at 8 bits)
// from L3, 1.4x slower in matmul_bench (prompt/Q4_K_R16/int8/1408x2048/n:512).
// sums(rows, tiles, r0, x, first_group, end_group, out) adds groups [first_group, end_group) of
// rows r0 .. r0 + rows - 1 against the tiles x[0 .. tiles - 1] (views made by `view` from
// m.tiles, tile_bytes apart) to out[rows][tiles] (rows and tiles: std::integral_constant). The
// running sums wait in `partial` ([tile][16 rows] vectors, partial_sums_bytes) between chunks:
// stored and reloaded they keep their bits, and each group's float steps stay in group order, so
// the results are those of one pass.
template <int kGroup, int kChunkCols, class Tile, class Sums>
void sixteen_rows_against_every_tile(const LanesMatmul& m, int64_t row, __m512* partial,
                                     size_t tile_bytes, Tile (*view)(const uint8_t*, int64_t),
                                     Sums sums) {
  constexpr int kRows = 4, kChunkGroups = kChunkCols / kGroup;
  constexpr std::integral_constant<int, kRows> four_rows;
  constexpr std::integral_constant<int, 2 * kRows> eight_rows;
  constexpr std::integral_constant<int, 1> one_tile;
  constexpr std::integral_constant<int, 2> two_tiles;
  const int64_t n_tiles = (m.n_tokens + kLanes - 1) / kLanes, n_groups = m.cols / kGroup;
  for (int64_t i = 0; i < n_tiles * 16; ++i) partial[i] = _mm512_setzero_ps();
  for (int64_t first_group = 0; first_group < n_groups; first_group += kChunkGroups) {
    const int64_t end_group = std::min(n_groups, first_group + kChunkGroups);
    for (int64_t tile = 0; tile < n_tiles; tile += 2) {
      Tile x[2];
      for (int k = 0; k < 2 && tile + k < n_tiles; ++k)
        x[k] = view(m.tiles + size_t(tile + k) * tile_bytes, m.cols);
      if (tile + 1 < n_tiles) {
        for (int r0 = 0; r0 < 16; r0 += kRows) {
          __m512 out[kRows][2];
          for (int r = 0; r < kRows; ++r)
            for (int k = 0; k < 2; ++k) out[r][k] = partial[(tile + k) * 16 + r0 + r];
          sums(four_rows, two_tiles, r0, x, first_group, end_group, out);
          for (int r = 0; r < kRows; ++r)
            for (int k = 0; k < 2; ++k) partial[(tile + k) * 16 + r0 + r] = out[r][k];
        }
      } else {  // a last tile alone: twice the rows, so as many sums are in flight
        for (int r0 = 0; r0 < 16; r0 += 2 * kRows) {
          __m512 last[2 * kRows][1];
          for (int r = 0; r < 2 * kRows; ++r) last[r][0] = partial[tile * 16 + r0 + r];
          sums(eight_rows, one_tile, r0, x, first_group, end_group, last);
          for (int r = 0; r < 2 * kRows; ++r) partial[tile * 16 + r0 + r] = last[r][0];
        }
      }
    }
  }
  for (int64_t tile = 0; tile < n_tiles; ++tile) {
    __m512 out[16][1];
    for (int r = 0; r < 16; ++r) out[r][0] = partial[tile * 16 + r];
    store_lanes<16, 1>(m, out, row, tile * kLanes);
  }
}

}  // namespace
}  // namespace tandem::cpu

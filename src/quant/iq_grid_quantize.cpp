// Writing IQ2_XXS and IQ3_XXS (layouts in core/iq_blocks.h), for gen-model's benchmarks and the
// kernel tests: a simple method of our own, not equality with any other tool's quantizer.
//
// Both formats give each 32 weights a 4-bit scale s (x = d * (0.5 + s) * k * grid * sign, k = 1/4
// or 1/2) and each 8 weights 7 sign bits, the eighth implied by an even count of minus signs.
// Per 8 weights: the signs of x, with the sign of the smallest |x| flipped when the count is odd
// (the cheapest error); then the magnitudes, divided by the scale, rounded to the nearest of the
// format's levels, and that lattice point replaced by the grid point nearest to it (a table over
// the whole lattice, made on first use: 3^8 or 8^4 entries).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <vector>

#include "quant/formats.h"
#include "quant/quant_common.h"

namespace tandem::quant {
namespace {

// One format's grid, as the quantizer sees it.
template <class Point, size_t kPoints>
struct GridShape {
  const std::array<Point, kPoints>& points;
  int point_elems;          // 8 (IQ2) or 4 (IQ3)
  const int* levels;        // ascending
  int n_levels;
  float scale_factor;       // k: 1/4 (IQ2_XXS) or 1/2 (IQ3_XXS)
};

// For every lattice point (element j's level index in base n_levels digit j), the index of the
// grid point nearest to it in squared distance.
template <class Point, size_t kPoints>
std::vector<uint16_t> nearest_grid_points(const GridShape<Point, kPoints>& grid) {
  int lattice = 1;
  for (int j = 0; j < grid.point_elems; ++j) lattice *= grid.n_levels;
  std::vector<uint16_t> nearest(static_cast<size_t>(lattice));
  for (int index = 0; index < lattice; ++index) {
    int value[8];
    for (int j = 0, rest = index; j < grid.point_elems; ++j, rest /= grid.n_levels)
      value[j] = grid.levels[rest % grid.n_levels];
    int best = 0, best_distance = 1 << 30;
    for (size_t k = 0; k < kPoints; ++k) {
      int distance = 0;
      for (int j = 0; j < grid.point_elems; ++j) {
        const int delta = int((uint64_t(grid.points[k]) >> (8 * j)) & 0xFF) - value[j];
        distance += delta * delta;
      }
      if (distance < best_distance) best_distance = distance, best = int(k);
    }
    nearest[size_t(index)] = uint16_t(best);
  }
  return nearest;
}

// The nearest level's index of a magnitude in units of the scale.
int nearest_level(float v, const int* levels, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i)
    if (std::fabs(v - float(levels[i])) < std::fabs(v - float(levels[best]))) best = i;
  return best;
}

// The 7 stored sign bits of 8 values: minus signs, made even by flipping the smallest |x|.
uint32_t sign_bits(const float* x) {
  uint32_t negative = 0;
  int smallest = 0;
  for (int j = 0; j < 8; ++j) {
    if (x[j] < 0) negative |= 1u << j;
    if (std::fabs(x[j]) < std::fabs(x[smallest])) smallest = j;
  }
  if (__builtin_popcount(negative) & 1) negative ^= 1u << smallest;
  return negative & 127;
}

// Quantizes 256 values: returns d and fills, per 32, the scale s, the 4 sign indices and the
// grid indices (8 per 32 for 4-element points, 4 for 8-element ones).
template <class Point, size_t kPoints>
uint16_t fit_block(const float* x, const GridShape<Point, kPoints>& grid,
                   const std::vector<uint16_t>& nearest, int scales[8], uint32_t signs[8][4],
                   uint16_t indices[8][8]) {
  const float top = float(grid.levels[grid.n_levels - 1]);
  float wanted[8], max_wanted = 0;
  for (int ib = 0; ib < 8; ++ib) {
    wanted[ib] = abs_max(x + 32 * ib, 32) / top;  // the top level takes the largest magnitude
    max_wanted = std::max(max_wanted, wanted[ib]);
  }
  const uint16_t d_bits = f16_scale(max_wanted / (15.5f * grid.scale_factor));
  const float d = f16_to_f32(d_bits);
  for (int ib = 0; ib < 8; ++ib) {
    const float* xb = x + 32 * ib;
    const float per_unit = d * grid.scale_factor;
    scales[ib] = round_clamped(wanted[ib] * inverse_or_zero(per_unit) - 0.5f, 0, 15);
    const float inverse = inverse_or_zero(per_unit * (0.5f + float(scales[ib])));
    for (int l = 0; l < 4; ++l) signs[ib][l] = sign_bits(xb + 8 * l);
    const int points = 32 / grid.point_elems;
    for (int p = 0; p < points; ++p) {
      int index = 0;
      for (int j = grid.point_elems - 1; j >= 0; --j)
        index = index * grid.n_levels +
                nearest_level(std::fabs(xb[grid.point_elems * p + j]) * inverse, grid.levels, grid.n_levels);
      indices[ib][p] = nearest[size_t(index)];
    }
  }
  return d_bits;
}

const GridShape<uint64_t, 256> kIq2xxsShape{kIq2xxsGrid, 8, iq_detail::kIq2Levels, 3, 0.25f};
const GridShape<uint32_t, 256> kIq3xxsShape{kIq3xxsGrid, 4, iq_detail::kIq3xxsLevels, 8, 0.5f};

}  // namespace

void quantize_iq2_xxs(const float* x, BlockIQ2_XXS* y, int64_t blocks) {
  static const std::vector<uint16_t> nearest = nearest_grid_points(kIq2xxsShape);
  int scales[8];
  uint32_t signs[8][4];
  uint16_t indices[8][8];
  for (int64_t b = 0; b < blocks; ++b, x += kQK_K) {
    y[b].d = fit_block(x, kIq2xxsShape, nearest, scales, signs, indices);
    for (int ib = 0; ib < 8; ++ib) {
      uint8_t* sub = y[b].qs + 8 * ib;
      for (int l = 0; l < 4; ++l) sub[l] = uint8_t(indices[ib][l]);
      uint32_t signs_scale = uint32_t(scales[ib]) << 28;
      for (int l = 0; l < 4; ++l) signs_scale |= signs[ib][l] << (7 * l);
      std::memcpy(sub + 4, &signs_scale, sizeof(signs_scale));
    }
  }
}

void quantize_iq3_xxs(const float* x, BlockIQ3_XXS* y, int64_t blocks) {
  static const std::vector<uint16_t> nearest = nearest_grid_points(kIq3xxsShape);
  int scales[8];
  uint32_t signs[8][4];
  uint16_t indices[8][8];
  for (int64_t b = 0; b < blocks; ++b, x += kQK_K) {
    y[b].d = fit_block(x, kIq3xxsShape, nearest, scales, signs, indices);
    for (int ib = 0; ib < 8; ++ib) {
      for (int p = 0; p < 8; ++p) y[b].qs[8 * ib + p] = uint8_t(indices[ib][p]);
      uint32_t signs_scale = uint32_t(scales[ib]) << 28;
      for (int l = 0; l < 4; ++l) signs_scale |= signs[ib][l] << (7 * l);
      std::memcpy(y[b].qs + 64 + 4 * ib, &signs_scale, sizeof(signs_scale));
    }
  }
}

}  // namespace tandem::quant

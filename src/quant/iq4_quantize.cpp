// Writing IQ4_NL and IQ4_XS: x ≈ scale * kIq4NlValues[q], 32 elements per scale (the levels and
// block layouts in core/blocks.h). The levels are not evenly spaced, so the best scale is found
// by trying a few around the one that maps the largest-magnitude element onto the outermost
// level, each refined by least squares over the indices it picks, and keeping the one with the
// smallest squared error. Written for gen-model (benchmarks and tests of the kernels), not for
// equality with any other tool's quantizer.
#include <algorithm>
#include <array>
#include <cmath>

#include "quant/formats.h"
#include "quant/quant_common.h"

namespace tandem::quant {
namespace {

constexpr int kGroup = 32;

// The midpoints between consecutive levels, ascending.
constexpr std::array<float, 15> kMid = [] {
  std::array<float, 15> mid{};
  for (int i = 0; i < 15; ++i) mid[size_t(i)] = 0.5f * float(kIq4NlValues[i] + kIq4NlValues[i + 1]);
  return mid;
}();

// The index of the level nearest to v (in units of the levels): how many midpoints lie below
// it. Fifteen compares without branches (a binary search's branches cost twice as much here).
inline int nearest_level(float v) {
  int q = 0;
  for (float mid : kMid) q += v > mid;
  return q;
}

// The scale of a group of 32 and its indices: the candidate with the least squared error.
float fit_group(const float* x, uint8_t* q) {
  float amax = 0, max = 0;
  for (int i = 0; i < kGroup; ++i)
    if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), max = x[i];
  if (amax == 0) {
    for (int i = 0; i < kGroup; ++i) q[i] = uint8_t(nearest_level(0));
    return 0;
  }
  float best_scale = 0;
  double best_fit = -1;
  uint8_t trial[kGroup];
  // max onto -127 (the outer level on the negative side) and slightly inside or outside it. With
  // the least-squares scale s = Σxl / Σl² for the levels picked, the squared error is
  // Σx² - (Σxl)² / Σl²: the best candidate has the largest (Σxl)² / Σl².
  for (int step = -4; step <= 4; ++step) {
    const float scale = max / (float(kIq4NlValues[0]) + 2.0f * float(step));
    const float inverse = 1.0f / scale;
    double xl = 0, ll = 0;
    for (int i = 0; i < kGroup; ++i) {
      trial[i] = uint8_t(nearest_level(x[i] * inverse));
      const double level = kIq4NlValues[trial[i]];
      xl += double(x[i]) * level;
      ll += level * level;
    }
    const double fit = ll > 0 ? xl * xl / ll : 0;
    if (fit > best_fit) {
      best_fit = fit, best_scale = ll > 0 ? float(xl / ll) : scale;
      std::copy(trial, trial + kGroup, q);
    }
  }
  return best_scale;
}

// The f16 nearest to a scale, saturating instead of becoming infinity. (Not rounded away from
// zero as the linear formats' scales: the levels are picked for the scale stored, and the outer
// ones may clip.)
uint16_t f16_nearest(float d) {
  constexpr float kMaxF16 = 65504.0f;
  return f32_to_f16(std::min(std::max(d, -kMaxF16), kMaxF16));
}

// Indices of a group for the scale actually stored; returns their squared error.
double pick_levels(const float* x, float scale, uint8_t* q) {
  const float inverse = scale != 0 ? 1.0f / scale : 0.0f;
  double error = 0;
  for (int i = 0; i < kGroup; ++i) {
    q[i] = uint8_t(nearest_level(x[i] * inverse));
    const double e = double(x[i]) - double(scale) * kIq4NlValues[q[i]];
    error += e * e;
  }
  return error;
}

void pack_nibbles(const uint8_t* q, uint8_t* qs) {
  for (int i = 0; i < kGroup / 2; ++i) qs[i] = uint8_t(q[i] | (q[i + kGroup / 2] << 4));
}

}  // namespace

void quantize_iq4_nl(const float* x, BlockIQ4_NL* y, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, x += kGroup) {
    uint8_t q[kGroup];
    y[b].d = f16_nearest(fit_group(x, q));
    pick_levels(x, f16_to_f32(y[b].d), q);
    pack_nibbles(q, y[b].qs);
  }
}

// Each sub-block's scale as above; the block's f16 d maps the largest-magnitude one onto -32
// (the end of the 6-bit range with one more step), and each sub-block keeps the multiple of d
// near its scale (the nearest and two either side) whose indices, picked again for it, give
// the least squared error: d may be an f16 with few significant bits.
void quantize_iq4_xs(const float* x, BlockIQ4_XS* y, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, x += kQK_K) {
    float scales[8];
    uint8_t q[kGroup];
    float amax = 0, max = 0;
    for (int sub = 0; sub < 8; ++sub) {
      scales[sub] = fit_group(x + kGroup * sub, q);
      if (std::fabs(scales[sub]) > amax) amax = std::fabs(scales[sub]), max = scales[sub];
    }
    BlockIQ4_XS& block = y[b];
    block.d = f16_scale(max / -32.0f);  // away from zero: the largest stays in range
    const float d = f16_to_f32(block.d);
    const float inverse = d != 0 ? 1.0f / d : 0.0f;
    block.scales_h = 0;
    for (int i = 0; i < 4; ++i) block.scales_l[i] = 0;
    for (int sub = 0; sub < 8; ++sub) {
      const int nearest = round_clamped(scales[sub] * inverse, -32.0f, 31.0f);
      int level = nearest;
      double best = INFINITY;
      uint8_t trial[kGroup];
      for (int l = std::max(nearest - 2, -32); l <= std::min(nearest + 2, 31); ++l) {
        const double error = pick_levels(x + kGroup * sub, d * float(l), trial);
        if (error < best) {
          best = error, level = l;
          std::copy(trial, trial + kGroup, q);
        }
      }
      pack_nibbles(q, block.qs + 16 * sub);
      level += 32;
      block.scales_l[sub / 2] |= uint8_t((level & 0xF) << (4 * (sub % 2)));
      block.scales_h |= uint16_t((level >> 4) << (2 * sub));
    }
  }
}

}  // namespace tandem::quant

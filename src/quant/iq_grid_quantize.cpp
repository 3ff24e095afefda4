// Writing the grid i-quants (layouts in core/iq_blocks.h), for gen-model's benchmarks and the
// kernel tests: a simple method of our own, not equality with any other tool's quantizer.
//
// Every format gives a group of 16 or 32 weights a small integer scale s, the group's scale being
// d * (a + b s) (IQ2: (0.5 + s) / 4, IQ3_XXS: (0.5 + s) / 2, IQ3_S and IQ1: 2 s + 1), and each
// 8 or 4 weights one grid point. Per block: each group's wanted scale maps its largest magnitude
// onto the top level, d is chosen so the largest of those fits the top s, each s is rounded.
// Per point: the values over the group's scale (their magnitudes where the format stores signs;
// IQ1 takes the signed values less its shift of +-1/8), each rounded to the nearest level, and
// that lattice point replaced by the grid point nearest to it (a table over the whole lattice,
// made on first use: 3^8 or 8^4 entries). Signs: IQ2_S and IQ3_S store all eight; IQ2_XXS,
// IQ2_XS and IQ3_XXS store seven, the eighth making the count of minus signs even, so where the
// count is odd the sign of the smallest |x| is flipped (the cheapest error).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

#include "quant/formats.h"
#include "quant/quant_common.h"

namespace tandem::quant {
namespace {

// A grid as the quantizer sees it: its points' values and, for every lattice point (element j's
// level index the base-L digit j), the nearest grid point.
struct GridFit {
  int elems;                  // 8 or 4 per point
  std::vector<int> levels;    // ascending
  std::vector<uint16_t> nearest;

  template <class Word, size_t kPoints>
  GridFit(const std::array<Word, kPoints>& points, int point_elems, std::vector<int> level_values)
      : elems(point_elems), levels(std::move(level_values)) {
    const int n_levels = int(levels.size());
    int lattice = 1;
    for (int j = 0; j < elems; ++j) lattice *= n_levels;
    nearest.assign(size_t(lattice), 0);
    std::vector<int> value(size_t(elems) * kPoints);
    for (size_t k = 0; k < kPoints; ++k)
      for (int j = 0; j < elems; ++j)
        value[k * size_t(elems) + size_t(j)] = int(int8_t((uint64_t(points[k]) >> (8 * j)) & 0xFF));
    for (int index = 0; index < lattice; ++index) {
      int target[8];
      for (int j = 0, rest = index; j < elems; ++j, rest /= n_levels) target[j] = levels[size_t(rest % n_levels)];
      int best = 0, best_distance = 1 << 30;
      for (size_t k = 0; k < kPoints; ++k) {
        int distance = 0;
        for (int j = 0; j < elems; ++j) {
          const int delta = value[k * size_t(elems) + size_t(j)] - target[j];
          distance += delta * delta;
        }
        if (distance < best_distance) best_distance = distance, best = int(k);
      }
      nearest[size_t(index)] = uint16_t(best);
    }
  }

  // The grid point nearest to `elems` values given in units of the scale.
  int fit(const float* v) const {
    int index = 0;
    for (int j = elems - 1; j >= 0; --j) {
      int level = 0;
      for (size_t i = 1; i < levels.size(); ++i)
        if (std::fabs(v[j] - float(levels[i])) < std::fabs(v[j] - float(levels[size_t(level)]))) level = int(i);
      index = index * int(levels.size()) + level;
    }
    return nearest[size_t(index)];
  }
};

const GridFit& iq2xxs_fit() {
  static const GridFit fit(kIq2xxsGrid, 8, {8, 25, 43});
  return fit;
}
const GridFit& iq2xs_fit() {
  static const GridFit fit(kIq2xsGrid, 8, {8, 25, 43});
  return fit;
}
const GridFit& iq2s_fit() {
  static const GridFit fit(kIq2sGrid, 8, {8, 25, 43});
  return fit;
}
const GridFit& iq3xxs_fit() {
  static const GridFit fit(kIq3xxsGrid, 4, {4, 12, 20, 28, 36, 44, 52, 62});
  return fit;
}
const GridFit& iq3s_fit() {
  static const GridFit fit(kIq3sGrid, 4, {1, 3, 5, 7, 9, 11, 13, 15});
  return fit;
}
const GridFit& iq1s_fit() {
  static const GridFit fit(kIq1sGrid, 8, {-1, 0, 1});
  return fit;
}

// A format's group scale: d * (a + b s), s in 0 .. max_s.
struct ScaleRule {
  float a, b;
  int max_s;
};

// d (as f16 bits) and each group's s for the wanted group scales.
uint16_t fit_scales(std::span<const float> wanted, ScaleRule rule, int* s) {
  const float top = *std::max_element(wanted.begin(), wanted.end());
  const uint16_t d_bits = f16_scale(top / (rule.a + rule.b * float(rule.max_s)));
  const float inverse = inverse_or_zero(f16_to_f32(d_bits));
  for (size_t g = 0; g < wanted.size(); ++g)
    s[g] = round_clamped((wanted[g] * inverse - rule.a) / rule.b, 0, float(rule.max_s));
  return d_bits;
}

// The sign bits of 8 values (bit j: x[j] < 0); with `even`, made even by flipping the smallest.
uint32_t sign_bits(const float* x, bool even) {
  uint32_t negative = 0;
  int smallest = 0;
  for (int j = 0; j < 8; ++j) {
    if (x[j] < 0) negative |= 1u << j;
    if (std::fabs(x[j]) < std::fabs(x[smallest])) smallest = j;
  }
  if (even && (__builtin_popcount(negative) & 1)) negative ^= 1u << smallest;
  return negative;
}

// Grid points of `n` magnitudes (in units of `scale`) of a signed format, one per fit.elems.
void fit_magnitudes(const float* x, int n, float scale, const GridFit& fit, int* points) {
  const float inverse = inverse_or_zero(scale);
  float v[8];
  for (int p = 0; p < n / fit.elems; ++p) {
    for (int j = 0; j < fit.elems; ++j) v[j] = std::fabs(x[fit.elems * p + j]) * inverse;
    points[p] = fit.fit(v);
  }
}

// The largest magnitude of each group of `group` over the top level: the scale each wants.
std::vector<float> wanted_scales(const float* x, int group, float top) {
  std::vector<float> wanted(size_t(kQK_K / group));
  for (size_t g = 0; g < wanted.size(); ++g) wanted[g] = abs_max(x + group * int(g), group) / top;
  return wanted;
}

void put_u32(uint8_t* p, uint32_t v) {
  std::memcpy(p, &v, sizeof(v));
}
void put_u16(uint8_t* p, uint16_t v) {
  std::memcpy(p, &v, sizeof(v));
}

// IQ2_XXS and IQ3_XXS: per 32, a word of four 7-bit sign fields under the 4-bit scale.
template <class Block>
void quantize_xxs(const float* x, Block* y, int64_t blocks, const GridFit& fit, float factor) {
  const ScaleRule rule{0.5f * factor, factor, 15};
  int s[8], points[8];
  for (int64_t b = 0; b < blocks; ++b, x += kQK_K) {
    const std::vector<float> wanted = wanted_scales(x, 32, float(fit.levels.back()));
    y[b].d = fit_scales(wanted, rule, s);
    const float d = f16_to_f32(y[b].d);
    for (int ib = 0; ib < 8; ++ib) {
      const float* xb = x + 32 * ib;
      fit_magnitudes(xb, 32, d * (rule.a + rule.b * float(s[ib])), fit, points);
      uint32_t signs_scale = uint32_t(s[ib]) << 28;
      for (int l = 0; l < 4; ++l) signs_scale |= (sign_bits(xb + 8 * l, true) & 127) << (7 * l);
      if constexpr (std::is_same_v<Block, BlockIQ2_XXS>) {
        for (int l = 0; l < 4; ++l) y[b].qs[8 * ib + l] = uint8_t(points[l]);
        put_u32(y[b].qs + 8 * ib + 4, signs_scale);
      } else {
        for (int p = 0; p < 8; ++p) y[b].qs[8 * ib + p] = uint8_t(points[p]);
        put_u32(y[b].qs + 64 + 4 * ib, signs_scale);
      }
    }
  }
}

// IQ2_XS and IQ2_S: a 4-bit scale per 16.
template <class Block>
void quantize_iq2_16(const float* x, Block* y, int64_t blocks, const GridFit& fit) {
  const ScaleRule rule{0.125f, 0.25f, 15};
  int s[16], points[2];
  for (int64_t b = 0; b < blocks; ++b, x += kQK_K) {
    y[b].d = fit_scales(wanted_scales(x, 16, 43.0f), rule, s);
    const float d = f16_to_f32(y[b].d);
    for (int g = 0; g < 8; ++g) y[b].scales[g] = uint8_t(s[2 * g] | s[2 * g + 1] << 4);
    if constexpr (std::is_same_v<Block, BlockIQ2_S>) std::memset(y[b].qh, 0, sizeof(y[b].qh));
    for (int g = 0; g < 16; ++g) {
      fit_magnitudes(x + 16 * g, 16, d * (rule.a + rule.b * float(s[g])), fit, points);
      for (int h = 0; h < 2; ++h) {
        const int k = 2 * g + h;  // the point's number in the block
        if constexpr (std::is_same_v<Block, BlockIQ2_XS>) {
          const uint32_t signs = sign_bits(x + 8 * k, true) & 127;
          put_u16(y[b].qs + 2 * k, uint16_t(points[h] | signs << 9));
        } else {
          y[b].qs[k] = uint8_t(points[h]);
          y[b].qh[k / 4] = uint8_t(y[b].qh[k / 4] | (points[h] >> 8) << (2 * (k % 4)));
          y[b].qs[32 + k] = uint8_t(sign_bits(x + 8 * k, false));
        }
      }
    }
  }
}

// IQ1: values (grid + delta) * d (2 s + 1), delta = +-1/8 per 32 (IQ1_S) or per 8 (IQ1_M): the
// shift takes the sign of the values' mean, the point is fitted to the values less the shift.
int fit_shifted(const float* x, float scale, bool* minus) {
  float sum = 0;
  for (int j = 0; j < 8; ++j) sum += x[j];
  *minus = sum < 0;
  const float inverse = inverse_or_zero(scale), delta = *minus ? -kIq1Delta : kIq1Delta;
  float v[8];
  for (int j = 0; j < 8; ++j) v[j] = x[j] * inverse - delta;
  return iq1s_fit().fit(v);
}

}  // namespace

void quantize_iq2_xxs(const float* x, BlockIQ2_XXS* y, int64_t blocks) {
  quantize_xxs(x, y, blocks, iq2xxs_fit(), 0.25f);
}

void quantize_iq3_xxs(const float* x, BlockIQ3_XXS* y, int64_t blocks) {
  quantize_xxs(x, y, blocks, iq3xxs_fit(), 0.5f);
}

void quantize_iq2_xs(const float* x, BlockIQ2_XS* y, int64_t blocks) {
  quantize_iq2_16(x, y, blocks, iq2xs_fit());
}

void quantize_iq2_s(const float* x, BlockIQ2_S* y, int64_t blocks) {
  quantize_iq2_16(x, y, blocks, iq2s_fit());
}

// IQ3_S: scale d (1 + 2 s) per 32, 4-element points of 512, every sign stored.
void quantize_iq3_s(const float* x, BlockIQ3_S* y, int64_t blocks) {
  const ScaleRule rule{1.0f, 2.0f, 15};
  int s[8], points[8];
  for (int64_t b = 0; b < blocks; ++b, x += kQK_K) {
    y[b].d = fit_scales(wanted_scales(x, 32, 15.0f), rule, s);
    const float d = f16_to_f32(y[b].d);
    std::memset(y[b].qh, 0, sizeof(y[b].qh));
    for (int i = 0; i < 4; ++i) y[b].scales[i] = uint8_t(s[2 * i] | s[2 * i + 1] << 4);
    for (int ib = 0; ib < 8; ++ib) {
      fit_magnitudes(x + 32 * ib, 32, d * (1.0f + 2.0f * float(s[ib])), iq3s_fit(), points);
      for (int p = 0; p < 8; ++p) {
        y[b].qs[8 * ib + p] = uint8_t(points[p]);
        y[b].qh[ib] = uint8_t(y[b].qh[ib] | (points[p] >> 8) << p);
      }
      for (int l = 0; l < 4; ++l) y[b].signs[4 * ib + l] = uint8_t(sign_bits(x + 32 * ib + 8 * l, false));
    }
  }
}

void quantize_iq1_s(const float* x, BlockIQ1_S* y, int64_t blocks) {
  const ScaleRule rule{1.0f, 2.0f, 7};
  int s[8];
  for (int64_t b = 0; b < blocks; ++b, x += kQK_K) {
    y[b].d = fit_scales(wanted_scales(x, 32, 1.0f + kIq1Delta), rule, s);
    const float d = f16_to_f32(y[b].d);
    for (int ib = 0; ib < 8; ++ib) {
      const float* xb = x + 32 * ib;
      const float scale = d * float(2 * s[ib] + 1);
      // One shift for the 32: the sign of their sum.
      float sum = 0;
      for (int j = 0; j < 32; ++j) sum += xb[j];
      const float delta = sum < 0 ? -kIq1Delta : kIq1Delta;
      const float inverse = inverse_or_zero(scale);
      uint16_t qh = uint16_t(s[ib] << 12 | (sum < 0 ? 0x8000 : 0));
      for (int l = 0; l < 4; ++l) {
        float v[8];
        for (int j = 0; j < 8; ++j) v[j] = xb[8 * l + j] * inverse - delta;
        const int point = iq1s_fit().fit(v);
        y[b].qs[4 * ib + l] = uint8_t(point);
        qh = uint16_t(qh | (point >> 8) << (3 * l));
      }
      put_u16(y[b].qh + 2 * ib, qh);
    }
  }
}

void quantize_iq1_m(const float* x, BlockIQ1_M* y, int64_t blocks) {
  const ScaleRule rule{1.0f, 2.0f, 7};
  int s[16];
  for (int64_t b = 0; b < blocks; ++b, x += kQK_K) {
    const uint16_t d_bits = fit_scales(wanted_scales(x, 16, 1.0f + kIq1Delta), rule, s);
    const float d = f16_to_f32(d_bits);
    uint16_t words[4] = {0, 0, 0, 0};
    for (int g = 0; g < 16; ++g) words[g / 4] = uint16_t(words[g / 4] | s[g] << (3 * (g % 4)));
    for (int w = 0; w < 4; ++w) words[w] = uint16_t(words[w] | ((d_bits >> (4 * w)) & 0xF) << 12);
    std::memcpy(y[b].scales, words, sizeof(words));
    std::memset(y[b].qh, 0, sizeof(y[b].qh));
    for (int k = 0; k < 32; ++k) {
      bool minus = false;
      const int point = fit_shifted(x + 8 * k, d * float(2 * s[k / 2] + 1), &minus);
      y[b].qs[k] = uint8_t(point);
      y[b].qh[k / 2] = uint8_t(y[b].qh[k / 2] | ((point >> 8) | (minus ? 8 : 0)) << (4 * (k % 2)));
    }
  }
}

}  // namespace tandem::quant

#pragma once
// Helpers shared by the per-format files of src/quant; not part of the public API.
#include <algorithm>
#include <bit>
#include <cstdint>

#include "core/half.h"

namespace tandem::quant {

// Round to nearest, ties to even, for |x| <= 2^22: adding 1.5 * 2^23 leaves the rounded integer
// in the low mantissa bits. Branch-free and vectorizable, unlike lrintf without -fno-math-errno.
inline int round_small(float x) {
  const int32_t bits = std::bit_cast<int32_t>(x + 12582912.0f);
  return (bits & 0x007fffff) - 0x00400000;
}

// x clamped to [lo, hi] and rounded; infinities saturate and a NaN (0 * inf from a degenerate
// scale) becomes lo, so the result is always in range. Written as the comparisons SSE's maxps
// and minps make, so that loops using it vectorize.
inline int round_clamped(float x, float lo, float hi) {
  x = x > lo ? x : lo;
  x = x < hi ? x : hi;
  return round_small(x);
}

// d as an f16 scale of at least its magnitude (rounded away from zero), saturating at the largest
// finite f16 instead of becoming infinity. Never rounding down keeps the largest quant of a
// block from overflowing its range, which matters where the scale is an f16 subnormal with only
// a few significant bits; a block of huge values decodes clipped rather than as inf and NaN.
inline uint16_t f16_scale(float d) {
  constexpr float kMaxF16 = 65504.0f;
  d = std::min(std::max(d, -kMaxF16), kMaxF16);
  uint16_t h = f32_to_f16(d);
  const float stored = f16_to_f32(h);
  // f16 bit patterns of one sign are ordered by magnitude: +1 is the next one away from zero.
  if ((stored < 0 ? -stored : stored) < (d < 0 ? -d : d)) ++h;
  return h;
}

// 1/d, or 0 when d is 0 (the block is all zero, every quant becomes the zero point).
inline float inverse_or_zero(float d) {
  return d != 0.0f ? 1.0f / d : 0.0f;
}

// Smallest and largest element of x; n is a positive multiple of 8. Kept in 8 lanes so that the
// compiler vectorizes the reduction without reassociating (no -ffast-math).
struct Range {
  float lo, hi;
};
inline Range min_max(const float* x, int n) {
  float lo[8], hi[8];
  for (int k = 0; k < 8; ++k) lo[k] = hi[k] = x[k];
  for (int i = 8; i < n; i += 8)
    for (int k = 0; k < 8; ++k)
      lo[k] = std::min(lo[k], x[i + k]), hi[k] = std::max(hi[k], x[i + k]);
  Range r{lo[0], hi[0]};
  for (int k = 1; k < 8; ++k) r.lo = std::min(r.lo, lo[k]), r.hi = std::max(r.hi, hi[k]);
  return r;
}

// Element of x with the largest magnitude, keeping its sign (the positive one on a tie).
inline float signed_abs_max(const float* x, int n) {
  const Range r = min_max(x, n);
  return r.hi >= -r.lo ? r.hi : r.lo;
}

inline float abs_max(const float* x, int n) {
  const Range r = min_max(x, n);
  return std::max(r.hi, -r.lo);
}

}  // namespace tandem::quant

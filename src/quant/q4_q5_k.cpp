// Q4_K and Q5_K: super-blocks of 256 in 8 sub-blocks of 32, x = (d * sc) * q - (dmin * m) with
// 6-bit sub-block scales sc and mins m (k_scales.h), f16 super-scales d and dmin, and q in 0..15
// (Q4_K) or 0..31 (Q5_K, fifth bit in qh).
//
// Quantizing fits each sub-block with a small search: a few candidate step sizes assign the
// quants, a least-squares refit of (scale, min) to each assignment keeps the one with the
// smallest squared error, and two Lloyd steps (reassign, refit) polish it. Then the 8 scales
// and mins are rounded to 6 bits against the stored super-scales, trying floor and ceiling of
// each, and the quants are recomputed against the scales actually stored.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "quant/formats.h"
#include "quant/k_scales.h"
#include "quant/quant_common.h"

namespace tandem::quant {
namespace {

constexpr int kSub = 32;              // elements per sub-block
constexpr int kSubs = kQK_K / kSub;   // sub-blocks per super-block
constexpr float kMaxInput = 1e9f;     // beyond what the format can represent: saturates
constexpr float kTinyRange = 1e-30f;  // far below the smallest f16 step: decodes as constant

// Added to the number of levels to get candidate step sizes (range / (nmax + delta)); larger
// deltas clip the ends of the range to spend finer steps on the bulk of the values. On Gaussian
// data more candidates or refinement steps gain under 1% of error for a large loss of speed.
constexpr float kStepDeltas[] = {-1.5f, -1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 1.5f};
constexpr int kRefineSteps = 2;

struct ScaleMin {
  float scale;  // >= 0
  float min;    // >= 0, subtracted: x ~ scale * q - min
};

ScaleMin fit_sub_block(const float* x, int nmax) {
  const Range r = min_max(x, kSub);
  const float hi = r.hi;
  const float lo = std::min(r.lo, 0.0f);  // mins are unsigned: the offset can only lower the values
  const float range = hi - lo;
  if (!(range > kTinyRange)) return {0.0f, -lo};

  // Partial sums in 8 lanes so the compiler can vectorize without reassociating.
  float lane_x[8] = {}, lane_xx[8] = {};
  for (int i = 0; i < kSub; i += 8)
    for (int k = 0; k < 8; ++k) lane_x[k] += x[i + k], lane_xx[k] += x[i + k] * x[i + k];
  double sum_x = 0, sum_xx = 0;
  for (int k = 0; k < 8; ++k) sum_x += lane_x[k], sum_xx += lane_xx[k];

  ScaleMin best{range / float(nmax), -lo};
  double best_err = -1;
  // Assigns quants q = round((x - offset) * inv_step), fits x ~ a * q + c to them by least
  // squares with c <= 0, and keeps the fit if its squared error is the smallest so far.
  const auto try_assignment = [&](float inv_step, float offset) {
    int q[kSub];
    for (int i = 0; i < kSub; ++i)
      q[i] = round_clamped((x[i] - offset) * inv_step, 0.0f, float(nmax));
    int sum_q = 0, sum_qq = 0;
    float lane_xq[8] = {};
    for (int i = 0; i < kSub; i += 8)
      for (int k = 0; k < 8; ++k) {
        sum_q += q[i + k], sum_qq += q[i + k] * q[i + k];
        lane_xq[k] += x[i + k] * float(q[i + k]);
      }
    double sum_xq = 0;
    for (int k = 0; k < 8; ++k) sum_xq += lane_xq[k];
    const double n = kSub;
    const double det = n * sum_qq - double(sum_q) * sum_q;
    if (det <= 0) return;  // every quant equal: nothing to fit
    double a = (n * sum_xq - sum_q * sum_x) / det;
    double c = (sum_x - a * sum_q) / n;
    if (c > 0) c = 0, a = sum_xq / sum_qq;
    a = std::max(a, 0.0);
    const double err =
        sum_xx - 2 * a * sum_xq - 2 * c * sum_x + a * a * sum_qq + 2 * a * c * sum_q + n * c * c;
    if (best_err < 0 || err < best_err) best_err = err, best = {float(a), float(-c)};
  };
  for (const float delta : kStepDeltas) try_assignment((float(nmax) + delta) / range, lo);
  // Lloyd steps: reassign against the best fit so far, then refit.
  for (int iter = 0; iter < kRefineSteps && best.scale > 0; ++iter)
    try_assignment(1.0f / best.scale, -best.min);
  return best;
}

// Squared error of quantizing a sub-block with the given decoded step and offset, and the quants.
float requantize(const float* x, int nmax, float step, float offset, uint8_t q[kSub]) {
  const float inv_step = inverse_or_zero(step);
  int v[kSub];
  for (int i = 0; i < kSub; ++i)
    v[i] = round_clamped((x[i] + offset) * inv_step, 0.0f, float(nmax));
  float lane_err[8] = {};
  for (int i = 0; i < kSub; i += 8)
    for (int k = 0; k < 8; ++k) {
      const float e = step * float(v[i + k]) - offset - x[i + k];
      lane_err[k] += e * e;
    }
  for (int i = 0; i < kSub; ++i) q[i] = uint8_t(v[i]);
  float err = 0;
  for (int k = 0; k < 8; ++k) err += lane_err[k];
  return err;
}

struct SuperScales {
  uint16_t d, dmin;
  uint8_t sc[kSubs], m[kSubs];
};

// Quants (0..nmax) of one super-block and its scales. The 6-bit scale and min of each
// sub-block are the floor or the ceiling of the fitted ones, whichever pair of the four
// quantizes the sub-block with the smallest error; the quants are those of that pair.
SuperScales quantize_super_block(const float* src, int nmax, uint8_t q[kQK_K]) {
  float x[kQK_K];
  for (int i = 0; i < kQK_K; ++i) x[i] = std::min(std::max(src[i], -kMaxInput), kMaxInput);
  ScaleMin fits[kSubs];
  float max_scale = 0, max_min = 0;
  for (int s = 0; s < kSubs; ++s) {
    fits[s] = fit_sub_block(x + kSub * s, nmax);
    max_scale = std::max(max_scale, fits[s].scale), max_min = std::max(max_min, fits[s].min);
  }
  SuperScales out;
  out.d = f16_scale(max_scale / 63.0f);
  out.dmin = f16_scale(max_min / 63.0f);
  const float d = f16_to_f32(out.d), dmin = f16_to_f32(out.dmin);
  const float inv_d = inverse_or_zero(d), inv_dmin = inverse_or_zero(dmin);
  for (int s = 0; s < kSubs; ++s) {
    const float* xs = x + kSub * s;
    const int sc_lo = round_clamped(std::floor(fits[s].scale * inv_d), 0.0f, 63.0f);
    const int m_lo = round_clamped(std::floor(fits[s].min * inv_dmin), 0.0f, 63.0f);
    float best_err = -1;
    uint8_t trial[kSub];
    for (int sc = sc_lo; sc <= std::min(sc_lo + 1, 63); ++sc)
      for (int m = m_lo; m <= std::min(m_lo + 1, 63); ++m) {
        // d * sc and dmin * m exactly as the decoder computes them.
        const float err = requantize(xs, nmax, d * float(sc), dmin * float(m), trial);
        if (best_err >= 0 && !(err < best_err)) continue;
        best_err = err, out.sc[s] = uint8_t(sc), out.m[s] = uint8_t(m);
        std::memcpy(q + kSub * s, trial, kSub);
      }
  }
  return out;
}

}  // namespace

void dequantize_q4_k(const BlockQ4_K* x, float* y, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b) {
    const float d = f16_to_f32(x[b].d), dmin = f16_to_f32(x[b].dmin);
    uint8_t sc[kSubs], m[kSubs];
    unpack_q4_k_scales(x[b].scales, sc, m);
    // Sub-blocks 2c and 2c+1 share the 32 bytes qs[32c ..]: low nibbles, then high nibbles.
    for (int c = 0; c < kSubs / 2; ++c) {
      const uint8_t* qs = x[b].qs + 32 * c;
      const float d1 = d * float(sc[2 * c]), m1 = dmin * float(m[2 * c]);
      const float d2 = d * float(sc[2 * c + 1]), m2 = dmin * float(m[2 * c + 1]);
      for (int l = 0; l < 32; ++l) *y++ = d1 * float(qs[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * float(qs[l] >> 4) - m2;
    }
  }
}

// As Q4_K; the fifth bit of the quants of sub-block s is bit s of qh[l].
void dequantize_q5_k(const BlockQ5_K* x, float* y, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b) {
    const float d = f16_to_f32(x[b].d), dmin = f16_to_f32(x[b].dmin);
    uint8_t sc[kSubs], m[kSubs];
    unpack_q4_k_scales(x[b].scales, sc, m);
    const uint8_t* qh = x[b].qh;
    for (int c = 0; c < kSubs / 2; ++c) {
      const uint8_t* qs = x[b].qs + 32 * c;
      const float d1 = d * float(sc[2 * c]), m1 = dmin * float(m[2 * c]);
      const float d2 = d * float(sc[2 * c + 1]), m2 = dmin * float(m[2 * c + 1]);
      for (int l = 0; l < 32; ++l)
        *y++ = d1 * float((qs[l] & 0xF) + (((qh[l] >> (2 * c)) & 1) << 4)) - m1;
      for (int l = 0; l < 32; ++l)
        *y++ = d2 * float((qs[l] >> 4) + (((qh[l] >> (2 * c + 1)) & 1) << 4)) - m2;
    }
  }
}

void quantize_q4_k(const float* x, BlockQ4_K* y, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, x += kQK_K) {
    uint8_t q[kQK_K];
    const SuperScales scales = quantize_super_block(x, 15, q);
    y[b].d = scales.d;
    y[b].dmin = scales.dmin;
    pack_q4_k_scales(scales.sc, scales.m, y[b].scales);
    for (int c = 0; c < kSubs / 2; ++c)
      for (int l = 0; l < 32; ++l)
        y[b].qs[32 * c + l] = uint8_t(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
  }
}

void quantize_q5_k(const float* x, BlockQ5_K* y, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, x += kQK_K) {
    uint8_t q[kQK_K];
    const SuperScales scales = quantize_super_block(x, 31, q);
    y[b].d = scales.d;
    y[b].dmin = scales.dmin;
    pack_q4_k_scales(scales.sc, scales.m, y[b].scales);
    std::memset(y[b].qh, 0, sizeof y[b].qh);
    for (int c = 0; c < kSubs / 2; ++c)
      for (int l = 0; l < 32; ++l) {
        const int lo = q[64 * c + l], hi = q[64 * c + 32 + l];
        y[b].qs[32 * c + l] = uint8_t((lo & 0xF) | ((hi & 0xF) << 4));
        y[b].qh[l] |= uint8_t(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
      }
  }
}

}  // namespace tandem::quant

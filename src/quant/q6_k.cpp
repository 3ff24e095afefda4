// Q6_K: super-blocks of 256 in 16 sub-blocks of 16, x = (d * scale) * (q - 32) with signed 8-bit
// sub-block scales, an f16 super-scale d, and 6-bit quants (low 4 bits in ql, high 2 in qh).
//
// Element e = 128 h + 32 k + l (h in 0..1, k in 0..3, l in 0..31) keeps its low nibble in
// ql[64 h + l + 32 (k & 1)] (low nibble for k < 2, high for k >= 2) and its high 2 bits at bit
// 2k of qh[32 h + l].
//
// Quantizing fits each sub-block by trying a few step sizes that map the largest-magnitude
// element near -32 (the end with one more level), refitting the scale by least squares for each
// assignment, and keeping the smallest error; then scales are rounded to 8 bits against the
// stored super-scale and the quants recomputed against the scales actually stored.
#include <algorithm>

#include "quant/formats.h"
#include "quant/quant_common.h"

namespace tandem::quant {
namespace {

constexpr int kSub = 16;
constexpr int kSubs = kQK_K / kSub;
constexpr float kMaxInput = 1e9f;   // beyond what the format can represent: saturates
constexpr float kTinyMax = 1e-30f;  // far below the smallest f16 step: decodes as zero

// Candidate step sizes are max / (32 + delta). Coarser steps than max / 32 look worse on average
// but each lands the lattice differently, and the best of them per sub-block beats any single
// choice (normalized error on Gaussian data 0.0179 with deltas -0.5..1, 0.0167 with these).
constexpr float kStepDeltas[] = {-4.0f, -3.0f, -2.0f, -1.0f, 0.0f};

float fit_sub_block(const float* x) {
  const float max = signed_abs_max(x, kSub);
  if (!(std::max(max, -max) > kTinyMax)) return 0.0f;
  float best_scale = max / -32.0f;
  double best_score = -1;  // sum_xq^2 / sum_qq: larger means smaller squared error
  // Assigns quants q = round(x * inv_step), fits x ~ a * q by least squares, and keeps the fit
  // if its squared error is the smallest so far.
  const auto try_assignment = [&](float inv_step) {
    int sum_qq = 0;
    float lane_xq[8] = {};
    for (int i = 0; i < kSub; i += 8)
      for (int k = 0; k < 8; ++k) {
        const int q = round_clamped(x[i + k] * inv_step, -32.0f, 31.0f);
        sum_qq += q * q;
        lane_xq[k] += x[i + k] * float(q);
      }
    if (sum_qq == 0) return;
    double sum_xq = 0;
    for (int k = 0; k < 8; ++k) sum_xq += lane_xq[k];
    const double score = sum_xq * sum_xq / sum_qq;
    if (score > best_score) best_score = score, best_scale = float(sum_xq / sum_qq);
  };
  for (const float delta : kStepDeltas) try_assignment(-(32.0f + delta) / max);
  return best_scale;
}

}  // namespace

void dequantize_q6_k(const BlockQ6_K* x, float* y, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b) {
    const float d = f16_to_f32(x[b].d);
    for (int h = 0; h < 2; ++h, y += 128) {
      const uint8_t* ql = x[b].ql + 64 * h;
      const uint8_t* qh = x[b].qh + 32 * h;
      const int8_t* sc = x[b].scales + 8 * h;
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l + 0] = d * float(sc[is + 0]) * float(q1);
        y[l + 32] = d * float(sc[is + 2]) * float(q2);
        y[l + 64] = d * float(sc[is + 4]) * float(q3);
        y[l + 96] = d * float(sc[is + 6]) * float(q4);
      }
    }
  }
}

void quantize_q6_k(const float* src, BlockQ6_K* y, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, src += kQK_K) {
    float x[kQK_K];
    for (int i = 0; i < kQK_K; ++i) x[i] = std::min(std::max(src[i], -kMaxInput), kMaxInput);
    float scales[kSubs];
    for (int s = 0; s < kSubs; ++s) scales[s] = fit_sub_block(x + kSub * s);

    // The largest-magnitude scale maps to -128, the end of int8 with one more level.
    const float max_scale = signed_abs_max(scales, kSubs);
    y[b].d = f16_scale(max_scale / -128.0f);
    const float d = f16_to_f32(y[b].d);
    const float inv_d = inverse_or_zero(d);
    uint8_t q[kQK_K];
    for (int s = 0; s < kSubs; ++s) {
      y[b].scales[s] = int8_t(round_clamped(scales[s] * inv_d, -128.0f, 127.0f));
      const float inv_step = inverse_or_zero(d * float(y[b].scales[s]));
      for (int i = kSub * s; i < kSub * s + kSub; ++i)
        q[i] = uint8_t(round_clamped(x[i] * inv_step, -32.0f, 31.0f) + 32);
    }

    for (int h = 0; h < 2; ++h) {
      const uint8_t* qq = q + 128 * h;
      for (int l = 0; l < 32; ++l) {
        const int q1 = qq[l], q2 = qq[l + 32], q3 = qq[l + 64], q4 = qq[l + 96];
        y[b].ql[64 * h + l] = uint8_t((q1 & 0xF) | ((q3 & 0xF) << 4));
        y[b].ql[64 * h + l + 32] = uint8_t((q2 & 0xF) | ((q4 & 0xF) << 4));
        y[b].qh[32 * h + l] =
            uint8_t((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
      }
    }
  }
}

}  // namespace tandem::quant

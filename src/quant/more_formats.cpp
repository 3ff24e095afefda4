// Q4_1, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0 and MXFP4 (their layouts in core/blocks.h): decoding, and
// writing Q4_1, TQ1_0, TQ2_0 and MXFP4 (iq4_quantize.cpp writes the IQ4 ones). Each decoder
// multiplies in the order the format's reference decoder does, so the floats come out bit for
// bit (tests/quant/dequant_fixture_test.cpp checks ../shared/fixtures/dequant-cases-iq.json).
// The writers are for gen-model's benches and tests: plain rounding, not a search.
#include <array>
#include <cmath>
#include <cstring>

#include "quant/formats.h"
#include "quant/quant_common.h"

namespace tandem::quant {

void dequantize_q4_1(const BlockQ4_1* x, float* y, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, y += 32) {
    const float d = f16_to_f32(x[b].d), m = f16_to_f32(x[b].m);
    for (int j = 0; j < 16; ++j) {
      y[j] = float(x[b].qs[j] & 0xF) * d + m;
      y[j + 16] = float(x[b].qs[j] >> 4) * d + m;
    }
  }
}

void dequantize_iq4_nl(const BlockIQ4_NL* x, float* y, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, y += 32) {
    const float d = f16_to_f32(x[b].d);
    for (int j = 0; j < 16; ++j) {
      y[j] = d * float(kIq4NlValues[x[b].qs[j] & 0xF]);
      y[j + 16] = d * float(kIq4NlValues[x[b].qs[j] >> 4]);
    }
  }
}

void dequantize_iq4_xs(const BlockIQ4_XS* x, float* y, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b) {
    const float d = f16_to_f32(x[b].d);
    for (int sub = 0; sub < 8; ++sub, y += 32) {
      const float dl = d * float(iq4_xs_sub_scale(x[b], sub));
      const uint8_t* qs = x[b].qs + 16 * sub;
      for (int j = 0; j < 16; ++j) {
        y[j] = dl * float(kIq4NlValues[qs[j] & 0xF]);
        y[j + 16] = dl * float(kIq4NlValues[qs[j] >> 4]);
      }
    }
  }
}

// The ternary formats: x = d * (q - 1) with the quants in element order (core/blocks.h).
void dequantize_tq2_0(const BlockTQ2_0* x, float* y, int64_t blocks) {
  uint8_t q[256];
  for (int64_t b = 0; b < blocks; ++b) {
    const float d = f16_to_f32(x[b].d);
    tq2_0_quants(x[b], q);
    for (int i = 0; i < 256; ++i) *y++ = float(int(q[i]) - 1) * d;
  }
}

void dequantize_tq1_0(const BlockTQ1_0* x, float* y, int64_t blocks) {
  uint8_t q[256];
  for (int64_t b = 0; b < blocks; ++b) {
    const float d = f16_to_f32(x[b].d);
    tq1_0_quants(x[b], q);
    for (int i = 0; i < 256; ++i) *y++ = float(int(q[i]) - 1) * d;
  }
}

void dequantize_mxfp4(const BlockMXFP4* x, float* y, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, y += 32) {
    const float d = mxfp4_scale(x[b].e);
    for (int j = 0; j < 16; ++j) {
      y[j] = float(kE2M1Doubled.v[x[b].qs[j] & 0xF]) * d;
      y[j + 16] = float(kE2M1Doubled.v[x[b].qs[j] >> 4]) * d;
    }
  }
}

// ---- writers ----

// Q4_1: x = d * q + m, q in 0..15: m the block's minimum, d its range over 15 (both f16; the
// quants rounded against the stored values).
void quantize_q4_1(const float* x, BlockQ4_1* y, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, x += 32) {
    const Range r = min_max(x, 32);
    y[b].m = f32_to_f16(r.lo);
    const float m = f16_to_f32(y[b].m);
    y[b].d = f16_scale((r.hi - m) / 15.0f);
    const float id = inverse_or_zero(f16_to_f32(y[b].d));
    for (int j = 0; j < 16; ++j) {
      const int q0 = round_clamped((x[j] - m) * id, 0.0f, 15.0f);
      const int q1 = round_clamped((x[j + 16] - m) * id, 0.0f, 15.0f);
      y[b].qs[j] = uint8_t(q0 | (q1 << 4));
    }
  }
}

namespace {

// The ternary digit (0, 1, 2 for -1, 0, 1) of each of a super-block's 256 elements: x / d
// rounded, d the scale that decodes the block closest among the largest magnitude (exact for a
// block already on a ternary grid) and 0.5 to 2 times the mean magnitude (BitNet's "absmean").
void ternary_digits(const float* x, uint16_t* d_stored, uint8_t (&digits)[256]) {
  float mean = 0;
  for (int i = 0; i < 256; ++i) mean += x[i] < 0 ? -x[i] : x[i];
  mean /= 256.0f;
  float best_d = mean, best_error = INFINITY;
  for (int c = -1; c <= 15; ++c) {
    const float d = c < 0 ? abs_max(x, 256) : mean * (0.5f + 0.1f * float(c));
    const float id = inverse_or_zero(d);
    float error = 0;
    for (int i = 0; i < 256; ++i) {
      const float diff = float(round_clamped(x[i] * id, -1.0f, 1.0f)) * d - x[i];
      error += diff * diff;
    }
    if (error < best_error) best_error = error, best_d = d;
  }
  *d_stored = f16_scale(best_d);
  const float id = inverse_or_zero(f16_to_f32(*d_stored));
  for (int i = 0; i < 256; ++i) digits[i] = uint8_t(round_clamped(x[i] * id, -1.0f, 1.0f) + 1);
}

// n digits (most significant first, n <= 5) as the byte whose digit k the decoder reads as the
// top base-3 digit of (byte * 3^k) mod 256: the base-3 fraction 0.d0 d1 d2 d3 d4 scaled to 256
// and rounded up, so that every prefix lands inside its digit's interval.
uint8_t ternary_byte(const uint8_t* digits, int n, int stride) {
  int value = 0;
  for (int k = 0; k < 5; ++k) value = value * 3 + (k < n ? digits[k * stride] : 0);
  return uint8_t((value * 256 + 242) / 243);
}

}  // namespace

// TQ2_0: element 128 h + 32 k + m in bits 2k of qs[32 h + m], digit + 1 (dequantize_tq2_0).
void quantize_tq2_0(const float* x, BlockTQ2_0* y, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, x += 256) {
    uint8_t digits[256];
    ternary_digits(x, &y[b].d, digits);
    std::memset(y[b].qs, 0, sizeof(y[b].qs));
    for (int i = 0; i < 256; ++i) {
      const int half = i / 128, k = (i % 128) / 32, m = i % 32;
      y[b].qs[32 * half + m] |= uint8_t(digits[i] << (2 * k));
    }
  }
}

// TQ1_0: digit n of qs[m] is element 32 n + m (m < 32), of qs[32 + m] element 160 + 16 n + m,
// of qh[m] element 240 + 4 n + m (dequantize_tq1_0).
void quantize_tq1_0(const float* x, BlockTQ1_0* y, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, x += 256) {
    uint8_t digits[256];
    ternary_digits(x, &y[b].d, digits);
    for (int m = 0; m < 32; ++m) y[b].qs[m] = ternary_byte(digits + m, 5, 32);
    for (int m = 0; m < 16; ++m) y[b].qs[32 + m] = ternary_byte(digits + 160 + m, 5, 16);
    for (int m = 0; m < 4; ++m) y[b].qh[m] = ternary_byte(digits + 240 + m, 4, 4);
  }
}

// MXFP4: the block exponent whose E2M1 grid (largest value 6) covers the largest magnitude,
// or the one below it if that decodes the block closer; each element the nearest of the 16
// codes.
void quantize_mxfp4(const float* x, BlockMXFP4* y, int64_t blocks) {
  auto encode = [](const float* x, uint8_t e, uint8_t* codes) {
    const float d = mxfp4_scale(e);
    float error = 0;
    for (int j = 0; j < 32; ++j) {
      int best = 0;
      float best_error = INFINITY;
      for (int code = 0; code < 16; ++code) {
        const float diff = float(kE2M1Doubled.v[code]) * d - x[j];
        if (diff * diff < best_error) best_error = diff * diff, best = code;
      }
      codes[j] = uint8_t(best);
      error += best_error;
    }
    return error;
  };
  for (int64_t b = 0; b < blocks; ++b, x += 32) {
    const float amax = abs_max(x, 32);
    // 6 * 2^(e - 127) >= amax: e = 127 + ceil(log2(amax / 6)), within the format's 0..254.
    int e = amax > 0 ? 127 + int(std::ceil(std::log2(amax / 6.0f))) : 0;
    e = std::clamp(e, 0, 254);
    uint8_t codes[32], lower[32];
    uint8_t chosen = uint8_t(e);
    const float error = encode(x, uint8_t(e), codes);
    if (e > 0 && encode(x, uint8_t(e - 1), lower) < error) {
      chosen = uint8_t(e - 1);
      std::memcpy(codes, lower, sizeof(codes));
    }
    y[b].e = chosen;
    for (int j = 0; j < 16; ++j) y[b].qs[j] = uint8_t(codes[j] | (codes[j + 16] << 4));
  }
}

}  // namespace tandem::quant

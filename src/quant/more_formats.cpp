// Q4_1, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0 and MXFP4: decoding only (their layouts in core/blocks.h).
// Each multiplies in the order the format's reference decoder does, so the floats come out bit
// for bit (tests/quant/dequant_fixture_test.cpp checks ../shared/fixtures/dequant-cases-iq.json).
#include <array>
#include <cstring>

#include "quant/formats.h"
#include "quant/quant_common.h"

namespace tandem::quant {
namespace {

// FP4 E2M1 values, doubled so that they are integers: sign bit 3, exponent bits 1-2 (bias 1),
// mantissa bit 0; exponent 0 is subnormal (m * 0.5). MXFP4 halves its block scale to make up.
constexpr std::array<int8_t, 16> kE2M1Doubled = [] {
  std::array<int8_t, 16> v{};
  for (int code = 0; code < 16; ++code) {
    const int e = (code >> 1) & 3, m = code & 1;
    const int doubled = e == 0 ? m : (1 << e) + m * (1 << (e - 1));
    v[size_t(code)] = int8_t(code & 8 ? -doubled : doubled);
  }
  return v;
}();
static_assert(kE2M1Doubled[7] == 12 && kE2M1Doubled[5] == 6 && kE2M1Doubled[9] == -1);

// 2^(e - 128): the block's power of two, halved for the doubled values. e = 0 and 1 give the
// float subnormals 2^-128 and 2^-127.
float e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? uint32_t(0x00200000) << e : uint32_t(e - 1) << 23;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// One ternary digit, -1, 0 or 1, of a TQ1_0 byte: the top base-3 digit of b * 3^n mod 256.
int ternary_digit(uint8_t b, int n) {
  static constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
  const uint8_t q = uint8_t(b * kPow3[n]);
  return int((uint16_t(q) * 3) >> 8) - 1;
}

}  // namespace

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

void dequantize_tq2_0(const BlockTQ2_0* x, float* y, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b) {
    const float d = f16_to_f32(x[b].d);
    for (int half = 0; half < 2; ++half)
      for (int k = 0; k < 4; ++k)
        for (int m = 0; m < 32; ++m) *y++ = float(((x[b].qs[32 * half + m] >> (2 * k)) & 3) - 1) * d;
  }
}

void dequantize_tq1_0(const BlockTQ1_0* x, float* y, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b) {
    const float d = f16_to_f32(x[b].d);
    // Bytes 0-31 give five digits each (160 elements), bytes 32-47 five each (80), qh four
    // each (16); digit n of a run of bytes before digit n + 1.
    for (int n = 0; n < 5; ++n)
      for (int m = 0; m < 32; ++m) *y++ = float(ternary_digit(x[b].qs[m], n)) * d;
    for (int n = 0; n < 5; ++n)
      for (int m = 0; m < 16; ++m) *y++ = float(ternary_digit(x[b].qs[32 + m], n)) * d;
    for (int n = 0; n < 4; ++n)
      for (int m = 0; m < 4; ++m) *y++ = float(ternary_digit(x[b].qh[m], n)) * d;
  }
}

void dequantize_mxfp4(const BlockMXFP4* x, float* y, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, y += 32) {
    const float d = e8m0_half(x[b].e);
    for (int j = 0; j < 16; ++j) {
      y[j] = float(kE2M1Doubled[x[b].qs[j] & 0xF]) * d;
      y[j + 16] = float(kE2M1Doubled[x[b].qs[j] >> 4]) * d;
    }
  }
}

}  // namespace tandem::quant

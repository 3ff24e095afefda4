// Q5_0 and Q5_1: blocks of 32 with 5-bit quants, the low 4 bits packed as in Q4_0 and the fifth
// bit of element j in bit j of the little-endian 32-bit qh.
#include <algorithm>
#include <cstring>

#include "quant/formats.h"
#include "quant/quant_common.h"

namespace tandem::quant {
namespace {

// The 32 quants (0..31) of a block.
void unpack_q5(const uint8_t qs[16], const uint8_t qh_bytes[4], int q[32]) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, sizeof qh);
  for (int j = 0; j < 16; ++j) {
    q[j] = (qs[j] & 0xF) | int(((qh >> j) << 4) & 0x10);
    q[j + 16] = (qs[j] >> 4) | int((qh >> (j + 12)) & 0x10);
  }
}

}  // namespace

// x = d * (q - 16).
void dequantize_q5_0(const BlockQ5_0* x, float* y, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, y += kQK5_0) {
    const float d = f16_to_f32(x[b].d);
    int q[kQK5_0];
    unpack_q5(x[b].qs, x[b].qh, q);
    for (int j = 0; j < kQK5_0; ++j) y[j] = float(q[j] - 16) * d;
  }
}

// x = d * q + m.
void dequantize_q5_1(const BlockQ5_1* x, float* y, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, y += kQK5_1) {
    const float d = f16_to_f32(x[b].d);
    const float m = f16_to_f32(x[b].m);
    int q[kQK5_1];
    unpack_q5(x[b].qs, x[b].qh, q);
    for (int j = 0; j < kQK5_1; ++j) y[j] = float(q[j]) * d + m;
  }
}

// As Q4_0: the largest-magnitude element maps to -16, quants are rounded against the stored
// f16 scale.
void quantize_q5_0(const float* x, BlockQ5_0* y, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, x += kQK5_0) {
    const float max = signed_abs_max(x, kQK5_0);
    y[b].d = f16_scale(max / -16.0f);
    const float id = inverse_or_zero(f16_to_f32(y[b].d));
    uint32_t qh = 0;
    for (int j = 0; j < kQK5_0 / 2; ++j) {
      const int q0 = round_clamped(x[j] * id, -16.0f, 15.0f) + 16;
      const int q1 = round_clamped(x[j + 16] * id, -16.0f, 15.0f) + 16;
      y[b].qs[j] = uint8_t((q0 & 0xF) | ((q1 & 0xF) << 4));
      qh |= uint32_t(q0 >> 4) << j;
      qh |= uint32_t(q1 >> 4) << (j + 16);
    }
    std::memcpy(y[b].qh, &qh, sizeof qh);
  }
}

// The block's range onto 0..31: m the smallest element, d the step to the largest, quants
// rounded against the stored f16 values (llama.cpp's reference quantizer).
void quantize_q5_1(const float* x, BlockQ5_1* y, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, x += kQK5_1) {
    float min = x[0], max = x[0];
    for (int j = 1; j < kQK5_1; ++j) min = std::min(min, x[j]), max = std::max(max, x[j]);
    y[b].d = f16_scale((max - min) / 31.0f);
    y[b].m = f16_scale(min);
    const float id = inverse_or_zero(f16_to_f32(y[b].d)), m = f16_to_f32(y[b].m);
    uint32_t qh = 0;
    for (int j = 0; j < kQK5_1 / 2; ++j) {
      const int q0 = round_clamped((x[j] - m) * id, 0.0f, 31.0f);
      const int q1 = round_clamped((x[j + 16] - m) * id, 0.0f, 31.0f);
      y[b].qs[j] = uint8_t((q0 & 0xF) | ((q1 & 0xF) << 4));
      qh |= uint32_t(q0 >> 4) << j;
      qh |= uint32_t(q1 >> 4) << (j + 16);
    }
    std::memcpy(y[b].qh, &qh, sizeof qh);
  }
}

}  // namespace tandem::quant

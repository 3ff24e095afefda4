// Q4_0: blocks of 32, x = d * (q - 8) with q in 0..15 and an f16 scale d.
#include <cstring>

#include "quant/formats.h"
#include "quant/quant_common.h"

namespace tandem::quant {

void dequantize_q4_0(const BlockQ4_0* x, float* y, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, y += kQK4_0) {
    const float d = f16_to_f32(x[b].d);
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      const int q0 = (x[b].qs[j] & 0xF) - 8;
      const int q1 = (x[b].qs[j] >> 4) - 8;
      y[j] = float(q0) * d;
      y[j + kQK4_0 / 2] = float(q1) * d;
    }
  }
}

// The largest-magnitude element maps to -8, the end of the range with one more level, so the
// block uses all 16 levels. Quants are rounded against the f16 scale actually stored, which
// makes requantizing a decoded block reproduce it.
void quantize_q4_0(const float* x, BlockQ4_0* y, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, x += kQK4_0) {
    const float max = signed_abs_max(x, kQK4_0);
    y[b].d = f16_scale(max / -8.0f);
    const float id = inverse_or_zero(f16_to_f32(y[b].d));
    uint8_t q[kQK4_0];
    for (int j = 0; j < kQK4_0; ++j) q[j] = uint8_t(round_clamped(x[j] * id, -8.0f, 7.0f) + 8);
    for (int j = 0; j < kQK4_0 / 2; ++j) y[b].qs[j] = uint8_t(q[j] | (q[j + kQK4_0 / 2] << 4));
  }
}

}  // namespace tandem::quant

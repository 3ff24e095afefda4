// Q8_0 (weights and activations for Q8_0/Q4_0/Q5_x dot products) and Q8_K (activations for the
// k-quant dot products): symmetric 8-bit quants, x = d * q.
#include <cmath>
#include <cstring>

#include "quant/formats.h"
#include "quant/quant_common.h"

namespace tandem::quant {

void dequantize_q8_0(const BlockQ8_0* x, float* y, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, y += kQK8_0) {
    const float d = f16_to_f32(x[b].d);
    for (int j = 0; j < kQK8_0; ++j) y[j] = float(x[b].qs[j]) * d;
  }
}

// Quants in -127..127, rounded against the stored f16 scale: requantizing a decoded block gives
// back the same bytes.
void quantize_q8_0(const float* x, BlockQ8_0* y, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, x += kQK8_0) {
    y[b].d = f16_scale(abs_max(x, kQK8_0) / 127.0f);
    const float id = inverse_or_zero(f16_to_f32(y[b].d));
    for (int j = 0; j < kQK8_0; ++j) y[b].qs[j] = int8_t(round_clamped(x[j] * id, -127, 127));
  }
}

void dequantize_q8_k(const BlockQ8_K* x, float* y, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, y += kQK_K) {
    for (int j = 0; j < kQK_K; ++j) y[j] = x[b].d * float(x[b].qs[j]);
  }
}

// Quants in -127..127 (never -128, so kernels may negate them), float scale d = amax / 127, and
// bsums[j] = sum of qs[16j .. 16j+15].
void quantize_q8_k(const float* x, BlockQ8_K* y, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, x += kQK_K) {
    BlockQ8_K& out = y[b];
    const float amax = abs_max(x, kQK_K);
    out.d = amax / 127.0f;
    const float id = 127.0f / amax;
    if (amax == 0.0f) {
      std::memset(out.qs, 0, sizeof out.qs);
    } else if (std::isfinite(id)) {
      for (int j = 0; j < kQK_K; ++j) out.qs[j] = int8_t(round_clamped(x[j] * id, -127, 127));
    } else {
      // amax below ~4e-37: 127/amax overflows, so divide instead (rare, slow, still exact).
      for (int j = 0; j < kQK_K; ++j) out.qs[j] = int8_t(round_clamped(x[j] / out.d, -127, 127));
    }
    for (int g = 0; g < kQK_K / 16; ++g) {
      int sum = 0;
      for (int j = 0; j < 16; ++j) sum += out.qs[16 * g + j];
      out.bsums[g] = int16_t(sum);
    }
  }
}

}  // namespace tandem::quant

// Q2_K and Q3_K (decode only): super-blocks of 256 in 16 sub-blocks of 16 elements with 2-bit
// quants. Element e of a super-block takes its low 2 bits from byte qs[32 * (e / 128) + e % 32],
// at bit 2 * ((e % 128) / 32); its sub-block scale is number e / 16.
#include "quant/formats.h"
#include "quant/k_scales.h"
#include "quant/quant_common.h"

namespace tandem::quant {
namespace {

inline int low_bits(const uint8_t* qs, int e) {
  return (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
}

}  // namespace

// x = d * (scale & 15) * q - dmin * (scale >> 4), with the two products rounded to float first.
void dequantize_q2_k(const BlockQ2_K* x, float* y, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b) {
    const float d = f16_to_f32(x[b].d);
    const float dmin = f16_to_f32(x[b].dmin);
    for (int sub = 0; sub < kQK_K / 16; ++sub) {
      const uint8_t sc = x[b].scales[sub];
      const float dl = d * float(sc & 0xF);
      const float ml = dmin * float(sc >> 4);
      for (int e = 16 * sub; e < 16 * sub + 16; ++e) *y++ = dl * float(low_bits(x[b].qs, e)) - ml;
    }
  }
}

// x = (d * scale) * (q - 4 * !high), where the high bit of element e is bit (e / 32) of
// hmask[e % 32] (a cleared bit subtracts 4).
void dequantize_q3_k(const BlockQ3_K* x, float* y, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b) {
    const float d = f16_to_f32(x[b].d);
    int8_t scales[16];
    unpack_q3_k_scales(x[b].scales, scales);
    for (int sub = 0; sub < kQK_K / 16; ++sub) {
      const float dl = d * float(scales[sub]);
      for (int e = 16 * sub; e < 16 * sub + 16; ++e) {
        const bool high = (x[b].hmask[e % 32] >> (e / 32)) & 1;
        *y++ = dl * float(low_bits(x[b].qs, e) - (high ? 0 : 4));
      }
    }
  }
}

}  // namespace tandem::quant

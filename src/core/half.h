#pragma once
// Exact conversions between float32 and the 16-bit float formats stored in GGUF files.
// Decoding is exact (every f16/bf16 value is a float32); encoding rounds to nearest even.
#include <bit>
#include <cstdint>

namespace tandem {

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exponent = (h >> 10) & 0x1f;
  uint32_t mantissa = h & 0x3ff;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
  if (mantissa == 0) return std::bit_cast<float>(sign);
  // Subnormal: value = mantissa * 2^-24, exactly representable in float32.
  const float magnitude = float(mantissa) * 0x1p-24f;
  return sign ? -magnitude : magnitude;
}

inline uint16_t f32_to_f16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000;
  const uint32_t abs = x & 0x7fffffff;
  if (abs > 0x7f800000) return uint16_t(sign | 0x7e00);            // NaN stays NaN
  if (abs >= 0x477ff000) return uint16_t(sign | 0x7c00);           // rounds to >= 65520: inf
  if (abs < 0x38800000) {                                          // below the smallest normal
    if (abs < 0x33000000) return uint16_t(sign);                   // below half the smallest subnormal
    const uint32_t shift = 126 - (abs >> 23);                      // 14..24
    const uint32_t mantissa = (abs & 0x7fffff) | 0x800000;
    uint32_t result = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (result & 1))) ++result;
    return uint16_t(sign | result);
  }
  uint32_t result = ((abs >> 13) - (112u << 10));
  const uint32_t rest = abs & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (result & 1))) ++result;  // may carry into the exponent
  return uint16_t(sign | result);
}

inline float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffff) > 0x7f800000) return uint16_t((x >> 16) | 0x40);  // quiet NaN
  return uint16_t((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

}  // namespace tandem

#pragma once
// Functions that both the host and CUDA kernels call: the per-block arithmetic of the weight
// formats (quant/block_decode.h), expert routing and rotary angles (backends/). Written once,
// tested on the host against the scalar references, compiled a second time by nvcc for the GPU.
//
// TANDEM_HD marks such a function: __host__ __device__ under nvcc, plain inline elsewhere;
// TANDEM_UNROLL asks nvcc to unroll a loop (registers indexed by a loop counter stay registers).
// Float arithmetic whose rounding must match the host bit for bit goes through mul_rn/add_rn/
// sub_rn: nvcc fuses a * b - c into one FMA by default (one rounding instead of two), g++ in ISO
// C++ mode does not.
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif

#if defined(__CUDACC__)
#define TANDEM_HD __host__ __device__ __forceinline__
#else
#define TANDEM_HD inline
#endif
#if defined(__CUDA_ARCH__)  // nvcc's device pass only: the host compiler warns on the pragma
#define TANDEM_UNROLL _Pragma("unroll")
#else
#define TANDEM_UNROLL
#endif

namespace tandem::hd {

TANDEM_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

TANDEM_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

TANDEM_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

TANDEM_HD float bits_to_float(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

// The math library: std:: on the host, exactly what the CPU backend has always called (glibc's
// float functions), CUDA's expf/powf/cosf/sinf on the device (never the __expf intrinsics). Neither
// side rounds them correctly, so a device result may differ from the host's in the last bit or
// two: kernels share the logic, not these bits.
TANDEM_HD float exp_f(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  return std::exp(x);
#endif
}

TANDEM_HD float pow_f(float base, float exponent) {
#if defined(__CUDA_ARCH__)
  return powf(base, exponent);
#else
  return std::pow(base, exponent);
#endif
}

TANDEM_HD float cos_f(float x) {
#if defined(__CUDA_ARCH__)
  return cosf(x);
#else
  return std::cos(x);
#endif
}

TANDEM_HD float sin_f(float x) {
#if defined(__CUDA_ARCH__)
  return sinf(x);
#else
  return std::sin(x);
#endif
}

// x rounded to the nearest integer, ties to even (the default rounding mode on both sides).
TANDEM_HD float round_even(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return std::nearbyint(x);
#endif
}

// std::min and std::max (constexpr host functions: device code may not call them without
// --expt-relaxed-constexpr) with their exact rule: the first argument when neither is smaller
// (ties, and a NaN on either side).
TANDEM_HD float min_f(float a, float b) { return b < a ? b : a; }
TANDEM_HD float max_f(float a, float b) { return a < b ? b : a; }

// Little-endian loads from byte pointers: block fields sit at any byte offset (Q4_0 blocks are
// 18 bytes), so they are never read through wider pointers.
TANDEM_HD uint16_t load_u16(const uint8_t* p) { return uint16_t(p[0] | (p[1] << 8)); }
TANDEM_HD uint32_t load_u32(const uint8_t* p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}

// IEEE half and bfloat16 to float, exact (as core/half.h, which the device cannot call). The
// device converts halves with its conversion instruction: the same value for every half that is
// not a NaN (exactly representable either way), without the branches.
TANDEM_HD float f16_to_f32(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#endif
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exponent = (h >> 10) & 0x1f;
  const uint32_t mantissa = h & 0x3ff;
  if (exponent == 0x1f) return bits_to_float(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) return bits_to_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
  if (mantissa == 0) return bits_to_float(sign);
  const float magnitude = mul_rn(float(mantissa), 0x1p-24f);  // subnormal: exact
  return sign ? -magnitude : magnitude;
}

TANDEM_HD float bf16_to_f32(uint16_t h) { return bits_to_float(uint32_t(h) << 16); }

}  // namespace tandem::hd

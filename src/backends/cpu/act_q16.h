#pragma once
// ActKind::Q16: one token's activations quantized to 16 bits for the Int16 precision, the layout
// every quantized format's Int16 kernel reads. Structure of arrays, `cols` a multiple of 32.
// matmul's scratch starts rows 64-byte aligned, but kernels load and store with unaligned
// instructions (no cost on aligned data), so callers with their own buffers need not align:
//
//   int16_t q[cols]           x[i] ≈ d[i / 32] * q[i], q in [-32767, 32767] (never -32768, so
//                             no int16 x int16 pair product overflows in madd)
//   float   d[cols / 32]      amax of the block / 32767
//   float   sum16[cols / 16]  d[g / 2] * Σ q[16g .. 16g + 15]: the activation sums that the mins
//                             of Q5_1 / Q2_K / Q4_K / Q5_K multiply (per 16, so that they serve
//                             the 16-element sub-blocks of Q2_K; a 32-element sub-block adds two)
//
// One scale per 32 elements (not per 256 as Q8_K) keeps an outlier from costing its whole
// super-block precision; the price is one float multiply-add per 32 elements in the kernels.
// The offsets of Q4_0 / Q5_0 / Q6_K / Q3_K are applied to the weights in the integer domain,
// which int16 activations allow (no unsigned x signed trick as in the 8-bit kernels).
//
// Internal linkage, as kscales.h: included by files compiled for different instruction sets.
#include <cstddef>
#include <cstdint>

namespace tandem::cpu {
namespace {  // NOLINT(google-build-namespaces)

constexpr float kQ16Max = 32767.0f;

inline size_t q16_row_bytes(int64_t cols) {
  return size_t(cols) * sizeof(int16_t) + size_t(cols / 32) * sizeof(float) +
         size_t(cols / 16) * sizeof(float);
}

template <class Int16, class Float>
struct Q16RowOf {
  Int16* q;      // [cols]
  Float* d;      // [cols / 32]
  Float* sum16;  // [cols / 16]
};
using Q16Row = Q16RowOf<const int16_t, const float>;
using Q16RowOut = Q16RowOf<int16_t, float>;

inline Q16Row q16_row(const void* act_row, int64_t cols) {
  const auto* base = static_cast<const uint8_t*>(act_row);
  const auto* q = reinterpret_cast<const int16_t*>(base);
  const auto* d = reinterpret_cast<const float*>(base + size_t(cols) * sizeof(int16_t));
  return {q, d, d + cols / 32};
}

inline Q16RowOut q16_row_out(void* act_row, int64_t cols) {
  auto* base = static_cast<uint8_t*>(act_row);
  auto* q = reinterpret_cast<int16_t*>(base);
  auto* d = reinterpret_cast<float*>(base + size_t(cols) * sizeof(int16_t));
  return {q, d, d + cols / 32};
}

}  // namespace
}  // namespace tandem::cpu

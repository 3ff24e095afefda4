// Row dots for the formats tandem reads but has no kernels of their own for yet (TQ1_0,
// TQ2_0): each weight block decoded by its reference decoder (src/quant)
// into floats and multiplied with the F32 activations, in order, with one accumulator. Slow,
// exact: activations are not quantized, so these formats run as faithfully as the file allows
// until kernels that follow the project's activation-precision policy replace them (issue 16).
#include <algorithm>

#include "backends/cpu/kernels.h"
#include "core/dtype.h"
#include "quant/quant.h"

namespace tandem::cpu {
namespace {

template <DType kType>
float dot_dequantized(const void* weight_row, const void* act_row, int64_t cols) {
  // Up to 256 values at a time (whole blocks of every one of these formats).
  constexpr int64_t kChunk = 256;
  const DTypeInfo& info = dtype_info(kType);
  const int64_t chunk = cols % kChunk == 0 ? kChunk : int64_t(info.block_elems);
  const auto* w = static_cast<const uint8_t*>(weight_row);
  const auto* x = static_cast<const float*>(act_row);
  float values[kChunk];
  float sum = 0;
  for (int64_t c = 0; c < cols; c += chunk) {
    dequantize_row(kType, w + row_bytes(kType, uint64_t(c)), values, chunk);
    for (int64_t i = 0; i < chunk; ++i) sum += values[i] * x[c + i];
  }
  return sum;
}

}  // namespace

void fill_dequantized_kernels(KernelTable& table) {
  auto set = [&](DType type, RowDotFn dot) {
    for (int precision = 0; precision < kActPrecisions; ++precision)
      table.formats[size_t(precision)][size_t(type)] = {ActKind::F32, dot};
  };
  set(DType::TQ1_0, dot_dequantized<DType::TQ1_0>);
  set(DType::TQ2_0, dot_dequantized<DType::TQ2_0>);
}

}  // namespace tandem::cpu

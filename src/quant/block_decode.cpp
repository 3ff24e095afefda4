// decode_row: whole rows through the per-block decoders of block_decode.h, for the host tests
// that hold them against dequantize_row.
#include "quant/block_decode.h"

#include "core/error.h"

namespace tandem::blocks {

void decode_row(DType type, const void* row, float* out, int64_t n) {
  const bool decoded = visit_decoder(type, [&](auto decoder) {
    using D = decltype(decoder);
    TANDEM_CHECK(n >= 0 && n % D::kElems == 0);
    const auto* block = static_cast<const uint8_t*>(row);
    for (int64_t b = 0; b < n / D::kElems; ++b, block += D::kBytes)
      for (int group = 0; group < D::kElems / 8; ++group, out += 8) D::decode8(block, group, out);
  });
  TANDEM_CHECK(decoded);
}

}  // namespace tandem::blocks

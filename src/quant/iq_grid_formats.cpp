// The grid i-quants (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S): decoding. Each block
// is taken apart by core/iq_blocks.h into integer weights and group scales whose products are
// the format's values exactly (why: that header), so multiplying them out gives the reference
// decoder's floats bit for bit (checked against ../shared/fixtures/dequant-cases-iq.json).
#include "core/iq_blocks.h"
#include "quant/formats.h"

namespace tandem::quant {

template <class Block>
void dequantize_iq_grid(const Block* x, float* y, int64_t blocks) {
  constexpr int kGroup = kIqGroup<Block>;
  IqWeights weights;
  for (int64_t b = 0; b < blocks; ++b, y += kQK_K) {
    iq_weights(x[b], weights);
    for (int i = 0; i < kQK_K; ++i) y[i] = weights.scale[i / kGroup] * float(weights.w[i]);
  }
}

template void dequantize_iq_grid(const BlockIQ2_XXS*, float*, int64_t);
template void dequantize_iq_grid(const BlockIQ2_XS*, float*, int64_t);
template void dequantize_iq_grid(const BlockIQ2_S*, float*, int64_t);
template void dequantize_iq_grid(const BlockIQ3_XXS*, float*, int64_t);
template void dequantize_iq_grid(const BlockIQ3_S*, float*, int64_t);
template void dequantize_iq_grid(const BlockIQ1_S*, float*, int64_t);
template void dequantize_iq_grid(const BlockIQ1_M*, float*, int64_t);

}  // namespace tandem::quant

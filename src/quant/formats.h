#pragma once
// Per-format entry points behind the one switch in quant.cpp. `blocks` counts whole blocks of
// the format; the caller has checked the element count.
#include <cstdint>

#include "core/blocks.h"
#include "core/iq_blocks.h"

namespace tandem::quant {

void dequantize_f16(const uint16_t* x, float* y, int64_t n);
void dequantize_bf16(const uint16_t* x, float* y, int64_t n);
void quantize_f16(const float* x, uint16_t* y, int64_t n);
void quantize_bf16(const float* x, uint16_t* y, int64_t n);

void dequantize_q4_0(const BlockQ4_0* x, float* y, int64_t blocks);
void dequantize_q5_0(const BlockQ5_0* x, float* y, int64_t blocks);
void dequantize_q5_1(const BlockQ5_1* x, float* y, int64_t blocks);
void dequantize_q8_0(const BlockQ8_0* x, float* y, int64_t blocks);
void quantize_q4_0(const float* x, BlockQ4_0* y, int64_t blocks);
void quantize_q5_0(const float* x, BlockQ5_0* y, int64_t blocks);
void quantize_q5_1(const float* x, BlockQ5_1* y, int64_t blocks);
void quantize_q8_0(const float* x, BlockQ8_0* y, int64_t blocks);

void dequantize_q2_k(const BlockQ2_K* x, float* y, int64_t blocks);
void dequantize_q3_k(const BlockQ3_K* x, float* y, int64_t blocks);
void dequantize_q4_k(const BlockQ4_K* x, float* y, int64_t blocks);
void dequantize_q5_k(const BlockQ5_K* x, float* y, int64_t blocks);
void dequantize_q6_k(const BlockQ6_K* x, float* y, int64_t blocks);
void dequantize_q8_k(const BlockQ8_K* x, float* y, int64_t blocks);
void quantize_q4_k(const float* x, BlockQ4_K* y, int64_t blocks);
void quantize_q5_k(const float* x, BlockQ5_K* y, int64_t blocks);
void quantize_q6_k(const float* x, BlockQ6_K* y, int64_t blocks);
void quantize_q8_k(const float* x, BlockQ8_K* y, int64_t blocks);

// more_formats.cpp (and iq4_quantize.cpp, writing IQ4_NL and IQ4_XS).
void dequantize_q4_1(const BlockQ4_1* x, float* y, int64_t blocks);
void dequantize_iq4_nl(const BlockIQ4_NL* x, float* y, int64_t blocks);
void dequantize_iq4_xs(const BlockIQ4_XS* x, float* y, int64_t blocks);
void quantize_iq4_nl(const float* x, BlockIQ4_NL* y, int64_t blocks);
void quantize_iq4_xs(const float* x, BlockIQ4_XS* y, int64_t blocks);
void dequantize_tq1_0(const BlockTQ1_0* x, float* y, int64_t blocks);
void dequantize_tq2_0(const BlockTQ2_0* x, float* y, int64_t blocks);
void dequantize_mxfp4(const BlockMXFP4* x, float* y, int64_t blocks);
void quantize_q4_1(const float* x, BlockQ4_1* y, int64_t blocks);
void quantize_tq1_0(const float* x, BlockTQ1_0* y, int64_t blocks);
void quantize_tq2_0(const float* x, BlockTQ2_0* y, int64_t blocks);
void quantize_mxfp4(const float* x, BlockMXFP4* y, int64_t blocks);

// iq_grid_formats.cpp: the grid i-quants, Block one of core/iq_blocks.h's (instantiated there).
template <class Block>
void dequantize_iq_grid(const Block* x, float* y, int64_t blocks);
// iq_grid_quantize.cpp.
void quantize_iq2_xxs(const float* x, BlockIQ2_XXS* y, int64_t blocks);
void quantize_iq3_xxs(const float* x, BlockIQ3_XXS* y, int64_t blocks);
void quantize_iq2_xs(const float* x, BlockIQ2_XS* y, int64_t blocks);
void quantize_iq2_s(const float* x, BlockIQ2_S* y, int64_t blocks);
void quantize_iq3_s(const float* x, BlockIQ3_S* y, int64_t blocks);
void quantize_iq1_s(const float* x, BlockIQ1_S* y, int64_t blocks);
void quantize_iq1_m(const float* x, BlockIQ1_M* y, int64_t blocks);

}  // namespace tandem::quant

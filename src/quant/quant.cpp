#include "quant/quant.h"

#include <cstring>

#include "core/error.h"
#include "quant/formats.h"

namespace tandem {
namespace {

// Element count of a row checked against the format's block size; returns the block count.
int64_t whole_blocks(DType type, int64_t n, const char* what) {
  const int64_t block_elems = dtype_info(type).block_elems;
  if (n < 0 || n % block_elems != 0)
    fail("{}: a row of {} elements cannot be {} as {}, whose blocks hold {} elements", what, n,
         what, dtype_name(type), block_elems);
  return n / block_elems;
}

}  // namespace

bool can_dequantize(DType type) {
  switch (type) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
    case DType::Q4_0:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q8_0:
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::Q8_K:
    case DType::IQ4_NL:
    case DType::IQ4_XS:
    case DType::MXFP4:
    case DType::Q4_1:
    case DType::TQ1_0:
    case DType::TQ2_0:
      return true;
    default:
      return is_iq_grid(type);
  }
}

bool can_quantize(DType type) {
  switch (type) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
    case DType::Q4_0:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q8_0:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::Q8_K:
    case DType::IQ4_NL:
    case DType::IQ4_XS:
    case DType::Q4_1:
    case DType::TQ1_0:
    case DType::TQ2_0:
    case DType::MXFP4:
      return true;
    default:
      return is_iq_grid(type);
  }
}

void dequantize_row(DType type, const void* src, float* dst, int64_t n) {
  if (!can_dequantize(type)) fail("dequantize: format {} is not supported", dtype_name(type));
  const int64_t blocks = whole_blocks(type, n, "dequantized");
  using namespace quant;
  switch (type) {
    case DType::F32:
      std::memcpy(dst, src, size_t(n) * sizeof(float));
      return;
    case DType::F16:
      return dequantize_f16(static_cast<const uint16_t*>(src), dst, n);
    case DType::BF16:
      return dequantize_bf16(static_cast<const uint16_t*>(src), dst, n);
    case DType::Q4_0:
      return dequantize_q4_0(static_cast<const BlockQ4_0*>(src), dst, blocks);
    case DType::Q5_0:
      return dequantize_q5_0(static_cast<const BlockQ5_0*>(src), dst, blocks);
    case DType::Q5_1:
      return dequantize_q5_1(static_cast<const BlockQ5_1*>(src), dst, blocks);
    case DType::Q8_0:
      return dequantize_q8_0(static_cast<const BlockQ8_0*>(src), dst, blocks);
    case DType::Q2_K:
      return dequantize_q2_k(static_cast<const BlockQ2_K*>(src), dst, blocks);
    case DType::Q3_K:
      return dequantize_q3_k(static_cast<const BlockQ3_K*>(src), dst, blocks);
    case DType::Q4_K:
      return dequantize_q4_k(static_cast<const BlockQ4_K*>(src), dst, blocks);
    case DType::Q5_K:
      return dequantize_q5_k(static_cast<const BlockQ5_K*>(src), dst, blocks);
    case DType::Q6_K:
      return dequantize_q6_k(static_cast<const BlockQ6_K*>(src), dst, blocks);
    case DType::Q8_K:
      return dequantize_q8_k(static_cast<const BlockQ8_K*>(src), dst, blocks);
    case DType::Q4_1:
      return dequantize_q4_1(static_cast<const BlockQ4_1*>(src), dst, blocks);
    case DType::IQ4_NL:
      return dequantize_iq4_nl(static_cast<const BlockIQ4_NL*>(src), dst, blocks);
    case DType::IQ4_XS:
      return dequantize_iq4_xs(static_cast<const BlockIQ4_XS*>(src), dst, blocks);
    case DType::TQ1_0:
      return dequantize_tq1_0(static_cast<const BlockTQ1_0*>(src), dst, blocks);
    case DType::TQ2_0:
      return dequantize_tq2_0(static_cast<const BlockTQ2_0*>(src), dst, blocks);
    case DType::MXFP4:
      return dequantize_mxfp4(static_cast<const BlockMXFP4*>(src), dst, blocks);
    default:
      if (visit_iq_grid(type, [&](auto f) {
            dequantize_iq_grid(static_cast<const typename decltype(f)::Block*>(src), dst, blocks);
          }))
        return;
      break;
  }
  check_failed("dequantize_row: can_dequantize and the switch disagree", __FILE__, __LINE__);
}

void quantize_row(DType type, const float* src, void* dst, int64_t n) {
  if (!can_quantize(type)) fail("quantize: format {} is not supported", dtype_name(type));
  const int64_t blocks = whole_blocks(type, n, "quantized");
  using namespace quant;
  switch (type) {
    case DType::F32:
      std::memcpy(dst, src, size_t(n) * sizeof(float));
      return;
    case DType::F16:
      return quantize_f16(src, static_cast<uint16_t*>(dst), n);
    case DType::BF16:
      return quantize_bf16(src, static_cast<uint16_t*>(dst), n);
    case DType::Q4_0:
      return quantize_q4_0(src, static_cast<BlockQ4_0*>(dst), blocks);
    case DType::Q5_0:
      return quantize_q5_0(src, static_cast<BlockQ5_0*>(dst), blocks);
    case DType::Q5_1:
      return quantize_q5_1(src, static_cast<BlockQ5_1*>(dst), blocks);
    case DType::Q8_0:
      return quantize_q8_0(src, static_cast<BlockQ8_0*>(dst), blocks);
    case DType::Q4_K:
      return quantize_q4_k(src, static_cast<BlockQ4_K*>(dst), blocks);
    case DType::Q5_K:
      return quantize_q5_k(src, static_cast<BlockQ5_K*>(dst), blocks);
    case DType::Q6_K:
      return quantize_q6_k(src, static_cast<BlockQ6_K*>(dst), blocks);
    case DType::IQ4_NL:
      return quantize_iq4_nl(src, static_cast<BlockIQ4_NL*>(dst), blocks);
    case DType::IQ4_XS:
      return quantize_iq4_xs(src, static_cast<BlockIQ4_XS*>(dst), blocks);
    case DType::Q8_K:
      return quantize_q8_k(src, static_cast<BlockQ8_K*>(dst), blocks);
    case DType::Q4_1:
      return quantize_q4_1(src, static_cast<BlockQ4_1*>(dst), blocks);
    case DType::TQ1_0:
      return quantize_tq1_0(src, static_cast<BlockTQ1_0*>(dst), blocks);
    case DType::TQ2_0:
      return quantize_tq2_0(src, static_cast<BlockTQ2_0*>(dst), blocks);
    case DType::MXFP4:
      return quantize_mxfp4(src, static_cast<BlockMXFP4*>(dst), blocks);
    case DType::IQ2_XXS:
      return quantize_iq2_xxs(src, static_cast<BlockIQ2_XXS*>(dst), blocks);
    case DType::IQ3_XXS:
      return quantize_iq3_xxs(src, static_cast<BlockIQ3_XXS*>(dst), blocks);
    case DType::IQ2_XS:
      return quantize_iq2_xs(src, static_cast<BlockIQ2_XS*>(dst), blocks);
    case DType::IQ2_S:
      return quantize_iq2_s(src, static_cast<BlockIQ2_S*>(dst), blocks);
    case DType::IQ3_S:
      return quantize_iq3_s(src, static_cast<BlockIQ3_S*>(dst), blocks);
    case DType::IQ1_S:
      return quantize_iq1_s(src, static_cast<BlockIQ1_S*>(dst), blocks);
    case DType::IQ1_M:
      return quantize_iq1_m(src, static_cast<BlockIQ1_M*>(dst), blocks);
    default:
      break;
  }
  check_failed("quantize_row: can_quantize and the switch disagree", __FILE__, __LINE__);
}

}  // namespace tandem

#include "core/dtype.h"

#include <array>

#include "core/blocks.h"
#include "core/iq_blocks.h"
#include "core/error.h"

namespace tandem {
namespace {

constexpr std::array kDTypes = {
    DTypeInfo{DType::F32, "F32", 1, 4, true},
    DTypeInfo{DType::F16, "F16", 1, 2, true},
    DTypeInfo{DType::Q4_0, "Q4_0", kQK4_0, sizeof(BlockQ4_0), true},
    DTypeInfo{DType::Q4_1, "Q4_1", 32, sizeof(BlockQ4_1), true},
    DTypeInfo{DType::Q5_0, "Q5_0", kQK5_0, sizeof(BlockQ5_0), true},
    DTypeInfo{DType::Q5_1, "Q5_1", kQK5_1, sizeof(BlockQ5_1), true},
    DTypeInfo{DType::Q8_0, "Q8_0", kQK8_0, sizeof(BlockQ8_0), true},
    DTypeInfo{DType::Q8_1, "Q8_1", 32, 36, false},
    DTypeInfo{DType::Q2_K, "Q2_K", kQK_K, sizeof(BlockQ2_K), true},
    DTypeInfo{DType::Q3_K, "Q3_K", kQK_K, sizeof(BlockQ3_K), true},
    DTypeInfo{DType::Q4_K, "Q4_K", kQK_K, sizeof(BlockQ4_K), true},
    DTypeInfo{DType::Q5_K, "Q5_K", kQK_K, sizeof(BlockQ5_K), true},
    DTypeInfo{DType::Q6_K, "Q6_K", kQK_K, sizeof(BlockQ6_K), true},
    DTypeInfo{DType::Q8_K, "Q8_K", kQK_K, sizeof(BlockQ8_K), false},
    // The i-quants with lattice grids (core/iq_blocks.h).
    DTypeInfo{DType::IQ2_XXS, "IQ2_XXS", kQK_K, sizeof(BlockIQ2_XXS), true},
    DTypeInfo{DType::IQ2_XS, "IQ2_XS", kQK_K, sizeof(BlockIQ2_XS), true},
    DTypeInfo{DType::IQ3_XXS, "IQ3_XXS", kQK_K, sizeof(BlockIQ3_XXS), true},
    DTypeInfo{DType::IQ1_S, "IQ1_S", kQK_K, sizeof(BlockIQ1_S), true},
    DTypeInfo{DType::IQ4_NL, "IQ4_NL", 32, sizeof(BlockIQ4_NL), true},
    DTypeInfo{DType::IQ3_S, "IQ3_S", kQK_K, sizeof(BlockIQ3_S), true},
    DTypeInfo{DType::IQ2_S, "IQ2_S", kQK_K, sizeof(BlockIQ2_S), true},
    DTypeInfo{DType::IQ4_XS, "IQ4_XS", kQK_K, sizeof(BlockIQ4_XS), true},
    DTypeInfo{DType::IQ1_M, "IQ1_M", kQK_K, sizeof(BlockIQ1_M), true},
    DTypeInfo{DType::TQ1_0, "TQ1_0", kQK_K, sizeof(BlockTQ1_0), true},
    DTypeInfo{DType::TQ2_0, "TQ2_0", kQK_K, sizeof(BlockTQ2_0), true},
    DTypeInfo{DType::MXFP4, "MXFP4", 32, sizeof(BlockMXFP4), true},
    DTypeInfo{DType::I8, "I8", 1, 1, false},
    DTypeInfo{DType::I16, "I16", 1, 2, false},
    DTypeInfo{DType::I32, "I32", 1, 4, false},
    DTypeInfo{DType::I64, "I64", 1, 8, false},
    DTypeInfo{DType::F64, "F64", 1, 8, false},
    DTypeInfo{DType::BF16, "BF16", 1, 2, true},
    DTypeInfo{DType::Q5_0_R16, "Q5_0_R16", kQK5_0, sizeof(BlockQ5_0_R16) / 16, false, 16,
              DType::Q5_0},
    DTypeInfo{DType::Q8_0_R16, "Q8_0_R16", kQK8_0, sizeof(BlockQ8_0_R16) / 16, false, 16,
              DType::Q8_0},
    DTypeInfo{DType::Q4_K_R16, "Q4_K_R16", kQK_K, sizeof(BlockQ4_K_R16) / 16, false, 16,
              DType::Q4_K},
};

// Plain formats are their own base.
constexpr auto kTable = [] {
  auto table = kDTypes;
  for (DTypeInfo& info : table)
    if (info.row_group == 1) info.base = info.type;
  return table;
}();

}  // namespace

std::optional<DTypeInfo> find_dtype(uint32_t ggml_type) {
  for (const DTypeInfo& info : kTable)
    if (uint32_t(info.type) == ggml_type) return info;
  return std::nullopt;
}

const DTypeInfo& dtype_info(DType type) {
  for (const DTypeInfo& info : kTable)
    if (info.type == type) return info;
  check_failed("dtype_info: DType value outside the table", __FILE__, __LINE__);
}

std::optional<DType> interleaved_of(DType base) {
  for (const DTypeInfo& info : kTable)
    if (info.row_group > 1 && info.base == base) return info.type;
  return std::nullopt;
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const DTypeInfo& info : kTable)
    if (info.name == name) return info.type;
  return std::nullopt;
}

}  // namespace tandem

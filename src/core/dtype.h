#pragma once
// Tensor element formats, numbered as GGUF numbers them (ggml_type), and their block geometry.
// This is the one place that lists formats; everything else asks dtype_info().
#include <cstdint>
#include <optional>
#include <string_view>

namespace tandem {

enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
  // tandem's own formats, written by `tandem repack`: a GGUF format with 16 rows interleaved
  // (layouts in core/blocks.h), numbered 1000 + the number of the format they interleave.
  Q5_0_R16 = 1006,
  Q8_0_R16 = 1008,
  Q4_K_R16 = 1012,
};

struct DTypeInfo {
  DType type;
  std::string_view name;   // as GGUF tools print it: "Q4_K", "BF16"
  uint32_t block_elems;    // elements per block (1 for plain types)
  uint32_t block_bytes;    // bytes per block
  bool readable;           // tandem can dequantize it row by row
  // Interleaved formats: how many rows are stored together (16), and the format each row has
  // once taken apart. Plain formats: 1 and the format itself. An interleaved tensor's rows come
  // in groups of row_group, each group row_group * row_bytes() long, so the tensor's size and
  // the offset of every group are what they would be with independent rows.
  uint32_t row_group = 1;
  DType base = DType::F32;
};

// Information about a known format, or nullopt for a number we do not know (corrupt file,
// or a format newer than this build).
std::optional<DTypeInfo> find_dtype(uint32_t ggml_type);
const DTypeInfo& dtype_info(DType type);
std::optional<DType> dtype_from_name(std::string_view name);

inline std::string_view dtype_name(DType type) { return dtype_info(type).name; }
inline bool is_interleaved(DType type) { return dtype_info(type).row_group > 1; }
// The interleaved format whose base is `base` (Q4_K -> Q4_K_R16), if the table has one.
std::optional<DType> interleaved_of(DType base);

// Bytes of one row of n elements; n must be a multiple of the block size. For an interleaved
// format: a group's bytes divided by its rows.
inline uint64_t row_bytes(DType type, uint64_t n) {
  const DTypeInfo& info = dtype_info(type);
  return n / info.block_elems * info.block_bytes;
}

}  // namespace tandem

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
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  BF16 = 30,
};

struct DTypeInfo {
  DType type;
  std::string_view name;   // as GGUF tools print it: "Q4_K", "BF16"
  uint32_t block_elems;    // elements per block (1 for plain types)
  uint32_t block_bytes;    // bytes per block
  bool readable;           // tandem can dequantize it
};

// Information about a known format, or nullopt for a number we do not know (corrupt file,
// or a format newer than this build).
std::optional<DTypeInfo> find_dtype(uint32_t ggml_type);
const DTypeInfo& dtype_info(DType type);
std::optional<DType> dtype_from_name(std::string_view name);

inline std::string_view dtype_name(DType type) { return dtype_info(type).name; }

// Bytes of one row of n elements; n must be a multiple of the block size.
inline uint64_t row_bytes(DType type, uint64_t n) {
  const DTypeInfo& info = dtype_info(type);
  return n / info.block_elems * info.block_bytes;
}

}  // namespace tandem

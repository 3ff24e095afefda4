#include "quant/interleave.h"

#include <cstring>
#include <vector>

#include "core/blocks.h"
#include "core/error.h"
#include "quant/k_scales.h"
#include "quant/quant.h"

namespace tandem {
namespace {

constexpr int kRows = 16;

// One block column of a group in either direction: `row(r)` is row r's plain block and `g` the
// group's block; kToGroup reads the rows and writes the group, else the other way round (the
// written side starts zeroed, since nibbles are or-ed in).

// Q4_K: element e of sub-block j sits in chunk e / 4, pair position e % 2, nibble (e / 2) % 2.
template <bool kToGroup, class RowAt, class Group>
void q4_k_blocks(RowAt row, Group& g) {
  for (int r = 0; r < kRows; ++r) {
    auto& b = row(r);
    uint8_t scales[8], mins[8];
    if constexpr (kToGroup) {
      g.d[r] = b.d;
      g.dmin[r] = b.dmin;
      unpack_q4_k_scales(b.scales, scales, mins);
      for (int j = 0; j < 8; ++j) g.scales[j][r] = scales[j], g.mins[j][r] = mins[j];
    } else {
      b.d = g.d[r];
      b.dmin = g.dmin[r];
      for (int j = 0; j < 8; ++j) scales[j] = g.scales[j][r], mins[j] = g.mins[j][r];
      pack_q4_k_scales(scales, mins, b.scales);
    }
    for (int j = 0; j < 8; ++j) {
      for (int e = 0; e < 32; ++e) {
        // GGUF: sub-block j's element e is the low (j even) or high (j odd) nibble of
        // qs[32 * (j / 2) + e].
        auto& plain = b.qs[32 * (j / 2) + e];
        const int plain_shift = 4 * (j % 2);
        auto& mixed = g.qs[j][32 * (e / 4) + 2 * r + e % 2];
        const int mixed_shift = 4 * ((e / 2) % 2);
        if constexpr (kToGroup) {
          mixed = uint8_t(mixed | (((plain >> plain_shift) & 15) << mixed_shift));
        } else {
          plain = uint8_t(plain | (((mixed >> mixed_shift) & 15) << plain_shift));
        }
      }
    }
  }
}

// Q8_0: element e sits in chunk e / 2, pair position e % 2.
template <bool kToGroup, class RowAt, class Group>
void q8_0_blocks(RowAt row, Group& g) {
  for (int r = 0; r < kRows; ++r) {
    auto& b = row(r);
    if constexpr (kToGroup) g.d[r] = b.d;
    else b.d = g.d[r];
    for (int e = 0; e < kQK8_0; ++e) {
      auto& mixed = g.qs[32 * (e / 2) + 2 * r + e % 2];
      if constexpr (kToGroup) mixed = b.qs[e];
      else b.qs[e] = mixed;
    }
  }
}

// Every block column of one group; `Plain` and `Mixed` carry the constness of their side.
template <bool kToGroup, class Plain, class Mixed, class Blocks>
void convert(Plain* plain, Mixed* mixed, int64_t n_blocks, Blocks blocks) {
  if constexpr (kToGroup) std::memset(mixed, 0, size_t(n_blocks) * sizeof(Mixed));
  else std::memset(plain, 0, size_t(n_blocks) * kRows * sizeof(Plain));
  for (int64_t b = 0; b < n_blocks; ++b)
    blocks([&](int r) -> Plain& { return plain[r * n_blocks + b]; }, mixed[b]);
}

void check_group(DType type, int64_t cols) {
  const DTypeInfo& info = dtype_info(type);
  if (info.row_group != kRows)
    fail("{} is not one of tandem's interleaved formats", dtype_name(type));
  if (cols <= 0 || cols % info.block_elems != 0)
    fail("{}: rows of {} elements are not a whole number of {}-element blocks", dtype_name(type),
         cols, info.block_elems);
}

}  // namespace

bool has_interleaved_format(DType base) {
  return base == DType::Q8_0 || base == DType::Q4_K;
}

DType interleaved_format(DType base) {
  switch (base) {
    case DType::Q8_0:
      return DType::Q8_0_R16;
    case DType::Q4_K:
      return DType::Q4_K_R16;
    default:
      fail("{} has no interleaved format (tandem has Q8_0_R16 and Q4_K_R16)", dtype_name(base));
  }
}

void interleave_rows(DType type, const void* rows, int64_t cols, void* group) {
  check_group(type, cols);
  const int64_t n_blocks = cols / dtype_info(type).block_elems;
  if (type == DType::Q8_0_R16) {
    convert<true>(static_cast<const BlockQ8_0*>(rows), static_cast<BlockQ8_0_R16*>(group), n_blocks,
                  [](auto row, auto& g) { q8_0_blocks<true>(row, g); });
  } else {
    convert<true>(static_cast<const BlockQ4_K*>(rows), static_cast<BlockQ4_K_R16*>(group), n_blocks,
                  [](auto row, auto& g) { q4_k_blocks<true>(row, g); });
  }
}

void take_apart_rows(DType type, const void* group, int64_t cols, void* rows) {
  check_group(type, cols);
  const int64_t n_blocks = cols / dtype_info(type).block_elems;
  if (type == DType::Q8_0_R16) {
    convert<false>(static_cast<BlockQ8_0*>(rows), static_cast<const BlockQ8_0_R16*>(group), n_blocks,
                   [](auto row, auto& g) { q8_0_blocks<false>(row, g); });
  } else {
    convert<false>(static_cast<BlockQ4_K*>(rows), static_cast<const BlockQ4_K_R16*>(group), n_blocks,
                   [](auto row, auto& g) { q4_k_blocks<false>(row, g); });
  }
}

void dequantize_interleaved(DType type, const void* data, int64_t rows, int64_t cols, float* out) {
  const DTypeInfo& info = dtype_info(type);
  if (rows % kRows != 0)
    fail("{}: {} rows are not a whole number of {}-row groups", dtype_name(type), rows, kRows);
  const uint64_t group_bytes = kRows * row_bytes(type, uint64_t(cols));
  std::vector<uint8_t> plain(kRows * row_bytes(info.base, uint64_t(cols)));
  for (int64_t g = 0; g < rows / kRows; ++g) {
    take_apart_rows(type, static_cast<const uint8_t*>(data) + uint64_t(g) * group_bytes, cols,
                    plain.data());
    dequantize_row(info.base, plain.data(), out + g * kRows * cols, kRows * cols);
  }
}

}  // namespace tandem

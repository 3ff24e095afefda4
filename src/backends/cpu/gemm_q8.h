#pragma once
// Internal to the CPU backend: the many-token path of the Int8 matmul (8-bit token lanes).
//
// The same plan as the Int16 path (gemm_q16.h): each weight row is unpacked once and 16 tokens
// run in the 16 lanes of a vector, but four weights meet four activations per instruction
// instead of two (vpdpbusd: unsigned 8-bit x signed 8-bit, summed in groups of four), so the
// integer work per weight is halved. The activations are ActKind::Q8 (8 bits, one scale per 32
// elements) and the weights unpack to *unsigned* bytes u = w + o, where o is a per-format offset
// (a power of two: Q4_0 8, Q5_0 16, Q6_K 32, Q8_0 and the IQ4 levels 128; none for Q4_K / Q5_K,
// whose quants are unsigned and whose mins are applied in float). A group's integer sum
//   Σ w x = Σ u x - o Σ x
// is exact (|u| <= 255, |x| <= 127: at most 32 * 255 * 127 < 2^31), and starts from -o Σ x, a
// per-token number the tile carries. Then, per group, in group order, each lane does out +=
// float(sum) * (scale * dx), and for formats with mins out -= min * sum32: the Int16 path's float
// steps. So a token's result does not depend on its tile mates, and every instruction set gives
// the same bits (the portable version does the same operations in the same order, with fma).
//
// The tile of 16 tokens, from their prepared ActBlockQ8 rows:
//   int32_t quads[cols / 4][16]  lane t: the four int8 activations x[4i .. 4i + 3] of token t
//   float   d[cols / 32][16]     the block scales
//   float   sum32[cols / 32][16] d * Σ q over each 32-element block (for mins)
//   int32_t isum16[cols / 16][16] Σ q over each 16 elements (for offsets; a group of 32 adds two)
// Missing tokens of the last tile are zeros and come out as zeros, never stored.
//
// Internal linkage, as kscales.h: included by files compiled for different instruction sets.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "backends/cpu/gemm_q16.h"
#include "backends/cpu/kernels.h"

namespace tandem::cpu {
namespace {  // NOLINT(google-build-namespaces)

inline size_t q8_tile_bytes(int64_t cols) {
  return size_t(cols / 4) * kLanes * sizeof(int32_t) + 2 * size_t(cols / 32) * kLanes * sizeof(float) +
         size_t(cols / 16) * kLanes * sizeof(int32_t);
}

struct Q8Tile {
  const int32_t* quads;   // [cols / 4][16]
  const float* d;         // [cols / 32][16]
  const float* sum32;     // [cols / 32][16]
  const int32_t* isum16;  // [cols / 16][16]
};

inline Q8Tile q8_tile(const uint8_t* tile, int64_t cols) {
  const auto* quads = reinterpret_cast<const int32_t*>(tile);
  const auto* d = reinterpret_cast<const float*>(tile + size_t(cols / 4) * kLanes * sizeof(int32_t));
  const float* sum32 = d + (cols / 32) * kLanes;
  const auto* isum16 = reinterpret_cast<const int32_t*>(sum32 + (cols / 32) * kLanes);
  return {quads, d, sum32, isum16};
}

// Tile of tokens [first, first + n) from their prepared ActBlockQ8 rows (n <= 16; the rest zero).
inline void build_q8_tile(const uint8_t* act, size_t act_stride, int64_t first, int64_t n,
                          int64_t cols, uint8_t* tile) {
  std::memset(tile, 0, q8_tile_bytes(cols));
  const Q8Tile view = q8_tile(tile, cols);
  auto* quads = const_cast<int32_t*>(view.quads);
  auto* d = const_cast<float*>(view.d);
  auto* sum32 = const_cast<float*>(view.sum32);
  auto* isum16 = const_cast<int32_t*>(view.isum16);
  for (int64_t t = 0; t < n; ++t) {
    const auto* blocks = reinterpret_cast<const ActBlockQ8*>(act + size_t(first + t) * act_stride);
    for (int64_t b = 0; b < cols / 32; ++b) {
      const ActBlockQ8& block = blocks[b];
      for (int i = 0; i < 8; ++i) {
        int32_t quad;
        std::memcpy(&quad, block.qs + 4 * i, sizeof(quad));
        quads[(8 * b + i) * kLanes + t] = quad;
      }
      int32_t half_sums[2] = {0, 0};
      for (int i = 0; i < 32; ++i) half_sums[i / 16] += block.qs[i];
      d[b * kLanes + t] = block.d;
      sum32[b * kLanes + t] = block.d * float(block.sum);
      isum16[(2 * b) * kLanes + t] = half_sums[0];
      isum16[(2 * b + 1) * kLanes + t] = half_sums[1];
    }
  }
}

// How a format's row unpacks to bytes: elements per group, mins, and log2 of its offset o
// (0: none).
struct UnpackShape8 {
  int group = 32;
  bool mins = false;
  int offset_shift = 0;
};

// One weight row unpacked: w (uint8, w = q + o), scale and min per group.
using UnpackedRow8 = UnpackedRowOf<uint8_t>;

using UnpackRow8Fn = void (*)(const void* row, int64_t cols, UnpackedRow8 out);

struct RowUnpacker8 {
  UnpackRow8Fn unpack = nullptr;  // nullptr: the format has no 8-bit token-lanes path
  UnpackShape8 shape;
};

// The formats of kLanesFormats (gemm_q16.h), each with its offset.
inline RowUnpacker8 row_unpacker8(DType type) {
  switch (type) {
    case DType::Q8_0:
      return {unpack_q8_0<uint8_t, 128>, {32, false, 7}};
    case DType::Q4_0:
      return {unpack_q4_0<uint8_t, 0>, {32, false, 3}};
    case DType::Q5_0:
      return {unpack_q5_0<uint8_t, 0>, {32, false, 4}};
    case DType::Q4_1:
      return {unpack_q4_1<uint8_t>, {32, true, 0}};
    case DType::Q4_K:
      return {unpack_q4_q5_k<uint8_t, false, BlockQ4_K>, {32, true, 0}};
    case DType::Q5_K:
      return {unpack_q4_q5_k<uint8_t, true, BlockQ5_K>, {32, true, 0}};
    case DType::Q6_K:
      return {unpack_q6_k<uint8_t, 0>, {16, false, 5}};
    case DType::IQ4_NL:
      return {unpack_iq4_nl<uint8_t, 128>, {32, false, 7}};
    case DType::IQ4_XS:
      return {unpack_iq4_xs<uint8_t, 128>, {32, false, 7}};
    case DType::MXFP4:
      return {unpack_mxfp4<uint8_t, 128>, {32, false, 7}};
    // The ternary quants q (digit + 1) plus 7: u = digit + 8, offset 8 as Q4_0's.
    case DType::TQ1_0:
      return {unpack_ternary<uint8_t, 7, BlockTQ1_0, tq1_0_quants>, {32, false, 3}};
    case DType::TQ2_0:
      return {unpack_ternary<uint8_t, 7, BlockTQ2_0, tq2_0_quants>, {32, false, 3}};
    default: {
      // The grid i-quants' signed weights (|w| <= 62) plus 128, as Q8_0's; or none.
      RowUnpacker8 grid;
      visit_iq_grid(type, [&](auto f) {
        using Block = typename decltype(f)::Block;
        grid = {unpack_iq_grid<uint8_t, 128, Block>, {kIqGroup<Block>, false, 7}};
      });
      return grid;
    }
  }
}

// The kernel variants the formats' shapes need, made by each instruction set's file through
// lanes8_kernel_for(shape, [](auto v) { return its_kernel<decltype(v)::group, ...>; }).
template <int kGroup, bool kMins, int kOffsetShift>
struct Lanes8Variant {
  static constexpr int group = kGroup;
  static constexpr bool mins = kMins;
  static constexpr int offset_shift = kOffsetShift;
};

template <class Instantiate>
LanesRowsFn lanes8_kernel_for(UnpackShape8 shape, Instantiate instantiate) {
  if (shape.group == 16 && !shape.mins && shape.offset_shift == 5)
    return instantiate(Lanes8Variant<16, false, 5>{});
  if (shape.group == 16 && !shape.mins && shape.offset_shift == 7)
    return instantiate(Lanes8Variant<16, false, 7>{});
  if (shape.group == 32 && shape.mins && shape.offset_shift == 0)
    return instantiate(Lanes8Variant<32, true, 0>{});
  if (shape.group == 32 && !shape.mins && shape.offset_shift == 3)
    return instantiate(Lanes8Variant<32, false, 3>{});
  if (shape.group == 32 && !shape.mins && shape.offset_shift == 4)
    return instantiate(Lanes8Variant<32, false, 4>{});
  if (shape.group == 32 && !shape.mins && shape.offset_shift == 7)
    return instantiate(Lanes8Variant<32, false, 7>{});
  return nullptr;
}

// Room for `rows` unpacked rows of `cols` elements, and where row r lies in it.
inline size_t unpack8_scratch_bytes(int64_t rows, int64_t cols) {
  return size_t(rows) * (size_t(cols) + 2 * size_t(cols / 16) * sizeof(float));
}

inline UnpackedRow8 unpacked_row8(uint8_t* scratch, int64_t rows, int64_t cols, int64_t r) {
  auto* scale = reinterpret_cast<float*>(scratch + size_t(rows) * size_t(cols));
  float* min = scale + rows * (cols / 16);
  return {scratch + r * cols, scale + r * (cols / 16), min + r * (cols / 16)};
}

}  // namespace
}  // namespace tandem::cpu

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

// One weight row unpacked: u (uint8, u = w + o), scale and min per group.
struct UnpackedRow8 {
  uint8_t* u;    // [cols]
  float* scale;  // [cols / group]
  float* min;    // [cols / group], formats with mins only
};

inline void unpack8_q8_0(const void* row, int64_t cols, UnpackedRow8 out) {
  const auto* blocks = static_cast<const BlockQ8_0*>(row);
  for (int64_t b = 0; b < cols / 32; ++b) {
    for (int i = 0; i < 32; ++i) out.u[32 * b + i] = uint8_t(blocks[b].qs[i] + 128);
    out.scale[b] = f16_value(blocks[b].d);
  }
}

inline void unpack8_q4_0(const void* row, int64_t cols, UnpackedRow8 out) {
  const auto* blocks = static_cast<const BlockQ4_0*>(row);
  for (int64_t b = 0; b < cols / 32; ++b) {
    uint8_t* u = out.u + 32 * b;
    for (int i = 0; i < 16; ++i) {
      u[i] = blocks[b].qs[i] & 15;
      u[i + 16] = blocks[b].qs[i] >> 4;
    }
    out.scale[b] = f16_value(blocks[b].d);
  }
}

inline void unpack8_q5_0(const void* row, int64_t cols, UnpackedRow8 out) {
  const auto* blocks = static_cast<const BlockQ5_0*>(row);
  for (int64_t b = 0; b < cols / 32; ++b) {
    uint32_t qh;
    std::memcpy(&qh, blocks[b].qh, sizeof(qh));
    uint8_t* u = out.u + 32 * b;
    for (int i = 0; i < 16; ++i) {
      u[i] = uint8_t((blocks[b].qs[i] & 15) | ((qh >> i) & 1) << 4);
      u[i + 16] = uint8_t((blocks[b].qs[i] >> 4) | ((qh >> (i + 16)) & 1) << 4);
    }
    out.scale[b] = f16_value(blocks[b].d);
  }
}

template <bool kFifthBit, class Block>
inline void unpack8_q4_q5_k(const void* row, int64_t cols, UnpackedRow8 out) {
  const auto* blocks = static_cast<const Block*>(row);
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const Block& block = blocks[b];
    unpack_k_group_scales(block, b, out.scale, out.min);
    uint8_t* u = out.u + kQK_K * b;
    for (int c = 0; c < 4; ++c) {
      for (int i = 0; i < 32; ++i) {
        int lo = block.qs[32 * c + i] & 15, hi = block.qs[32 * c + i] >> 4;
        if constexpr (kFifthBit) {
          lo |= ((block.qh[i] >> (2 * c)) & 1) << 4;
          hi |= ((block.qh[i] >> (2 * c + 1)) & 1) << 4;
        }
        u[64 * c + i] = uint8_t(lo);
        u[64 * c + 32 + i] = uint8_t(hi);
      }
    }
  }
}

inline void unpack8_q6_k(const void* row, int64_t cols, UnpackedRow8 out) {
  const auto* blocks = static_cast<const BlockQ6_K*>(row);
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const BlockQ6_K& block = blocks[b];
    const float d = f16_value(block.d);
    for (int k = 0; k < 16; ++k) out.scale[16 * b + k] = d * float(block.scales[k]);
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = block.ql + 64 * half;
      const uint8_t* qh = block.qh + 32 * half;
      uint8_t* u = out.u + kQK_K * b + 128 * half;
      for (int i = 0; i < 32; ++i) {
        u[i] = uint8_t((ql[i] & 15) | ((qh[i] >> 0) & 3) << 4);
        u[32 + i] = uint8_t((ql[32 + i] & 15) | ((qh[i] >> 2) & 3) << 4);
        u[64 + i] = uint8_t((ql[i] >> 4) | ((qh[i] >> 4) & 3) << 4);
        u[96 + i] = uint8_t((ql[32 + i] >> 4) | ((qh[i] >> 6) & 3) << 4);
      }
    }
  }
}

inline void unpack8_iq4_32(const uint8_t* qs, uint8_t* u) {
  for (int i = 0; i < 16; ++i) {
    u[i] = uint8_t(kIq4NlValues[qs[i] & 15] + 128);
    u[i + 16] = uint8_t(kIq4NlValues[qs[i] >> 4] + 128);
  }
}

inline void unpack8_iq4_nl(const void* row, int64_t cols, UnpackedRow8 out) {
  const auto* blocks = static_cast<const BlockIQ4_NL*>(row);
  for (int64_t b = 0; b < cols / 32; ++b) {
    unpack8_iq4_32(blocks[b].qs, out.u + 32 * b);
    out.scale[b] = f16_value(blocks[b].d);
  }
}

inline void unpack8_iq4_xs(const void* row, int64_t cols, UnpackedRow8 out) {
  const auto* blocks = static_cast<const BlockIQ4_XS*>(row);
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const float d = f16_value(blocks[b].d);
    for (int sub = 0; sub < 8; ++sub) {
      unpack8_iq4_32(blocks[b].qs + 16 * sub, out.u + kQK_K * b + 32 * sub);
      out.scale[8 * b + sub] = d * float(iq4_xs_sub_scale(blocks[b], sub));
    }
  }
}

using UnpackRow8Fn = void (*)(const void* row, int64_t cols, UnpackedRow8 out);

struct RowUnpacker8 {
  UnpackRow8Fn unpack = nullptr;  // nullptr: the format has no 8-bit token-lanes path
  UnpackShape8 shape;
};

// The formats of kLanesFormats (gemm_q16.h), each with its offset.
inline RowUnpacker8 row_unpacker8(DType type) {
  switch (type) {
    case DType::Q8_0:
      return {unpack8_q8_0, {32, false, 7}};
    case DType::Q4_0:
      return {unpack8_q4_0, {32, false, 3}};
    case DType::Q5_0:
      return {unpack8_q5_0, {32, false, 4}};
    case DType::Q4_K:
      return {unpack8_q4_q5_k<false, BlockQ4_K>, {32, true, 0}};
    case DType::Q5_K:
      return {unpack8_q4_q5_k<true, BlockQ5_K>, {32, true, 0}};
    case DType::Q6_K:
      return {unpack8_q6_k, {16, false, 5}};
    case DType::IQ4_NL:
      return {unpack8_iq4_nl, {32, false, 7}};
    case DType::IQ4_XS:
      return {unpack8_iq4_xs, {32, false, 7}};
    default:
      return {};
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

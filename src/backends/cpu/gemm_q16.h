#pragma once
// Internal to the CPU backend: the many-token path of the Int16 matmul ("token lanes").
//
// The row-dot kernels spend most of their time unpacking weights and turning each 32-element
// block's integer sum into a float; with many tokens that work would be repeated for every token.
// Here each weight row is unpacked once (to int16 with the format's offsets applied, plus a float
// scale per group of 16 or 32 elements and, for formats with mins, a float min per group), and
// the tokens run in the 16 lanes of a vector: for each pair of weights (w[2i], w[2i+1]), one
// vpdpwssd adds w[2i] * x[2i][t] + w[2i+1] * x[2i+1][t] to lane t. A group's integer sums are
// exact (|w| <= 128 and |x| <= 32767: at most 32 * 128 * 32767 < 2^31); then, per group, in group
// order, each lane does out += float(sum) * (scale * dx) and out -= min * Σx. So a token's result
// is the same whatever other tokens share its tile, and the same on every instruction set (the
// portable version does the same operations in the same order, with fma).
//
// The activations are the Int16 path's (act_q16.h), transposed into tiles of 16 tokens:
//   int32_t pairs[cols / 2][16]   lane t: the int16 pair (q[2i], q[2i+1]) of token t
//   float   d[cols / 32][16]      the block scales of the 16 tokens
//   float   sum32[cols / 32][16]  d * Σ q over each 32-element block (for mins per 32)
// Missing tokens of the last tile are zeros and come out as zeros, never stored.
//
// Internal linkage, as kscales.h: included by files compiled for different instruction sets.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "backends/cpu/act_q16.h"
#include "backends/cpu/kscales.h"
#include "core/blocks.h"
#include "core/dtype.h"
#include "core/half.h"
#include "core/iq_blocks.h"

namespace tandem::cpu {
namespace {  // NOLINT(google-build-namespaces)

constexpr int kLanes = 16;

inline size_t q16_tile_bytes(int64_t cols) {
  return size_t(cols / 2) * kLanes * sizeof(int32_t) + 2 * size_t(cols / 32) * kLanes * sizeof(float);
}

struct Q16Tile {
  const int32_t* pairs;  // [cols / 2][16]
  const float* d;        // [cols / 32][16]
  const float* sum32;    // [cols / 32][16]
};

inline Q16Tile q16_tile(const uint8_t* tile, int64_t cols) {
  const auto* pairs = reinterpret_cast<const int32_t*>(tile);
  const auto* d = reinterpret_cast<const float*>(tile + size_t(cols / 2) * kLanes * sizeof(int32_t));
  return {pairs, d, d + (cols / 32) * kLanes};
}

// Tile of tokens [first, first + n) from their prepared Q16 rows (n <= 16; the rest zero).
inline void build_q16_tile(const uint8_t* act, size_t act_stride, int64_t first, int64_t n,
                           int64_t cols, uint8_t* tile) {
  std::memset(tile, 0, q16_tile_bytes(cols));
  auto* pairs = reinterpret_cast<int32_t*>(tile);
  auto* d = reinterpret_cast<float*>(tile + size_t(cols / 2) * kLanes * sizeof(int32_t));
  float* sum32 = d + (cols / 32) * kLanes;
  for (int64_t t = 0; t < n; ++t) {
    const Q16Row x = q16_row(act + size_t(first + t) * act_stride, cols);
    for (int64_t i = 0; i < cols / 2; ++i) {
      int32_t pair;
      std::memcpy(&pair, x.q + 2 * i, sizeof(pair));
      pairs[i * kLanes + t] = pair;
    }
    for (int64_t b = 0; b < cols / 32; ++b) {
      d[b * kLanes + t] = x.d[b];
      sum32[b * kLanes + t] = x.sum16[2 * b] + x.sum16[2 * b + 1];
    }
  }
}

// How a format's row unpacks: elements per group, and whether groups have a min.
struct UnpackShape {
  int group = 32;
  bool mins = false;
};

// One weight row unpacked: w (the Int16 path: int16 with the format's offsets applied, |w| <= 128;
// the Int8 path, gemm_q8.h: unsigned bytes), scale and min per group.
template <class T>
struct UnpackedRowOf {
  T* w;          // [cols]
  float* scale;  // [cols / group]
  float* min;    // [cols / group], formats with mins only
};
using UnpackedRow = UnpackedRowOf<int16_t>;

inline float f16_value(uint16_t h) {
  return f16_to_f32(h);
}

// The portable unpackers, for both paths: each element's integer quant q (before the format's
// offset) is stored as T(q + kBias). The Int16 path's kBias is the format's offset (-8 for Q4_0,
// ...), the Int8 path's 0, or +128 for formats whose quants are signed (Q8_0, the IQ4 levels).
template <class T, int kBias>
inline void unpack_q8_0(const void* row, int64_t cols, UnpackedRowOf<T> out) {
  const auto* blocks = static_cast<const BlockQ8_0*>(row);
  for (int64_t b = 0; b < cols / 32; ++b) {
    for (int i = 0; i < 32; ++i) out.w[32 * b + i] = T(blocks[b].qs[i] + kBias);
    out.scale[b] = f16_value(blocks[b].d);
  }
}

template <class T, int kBias>
inline void unpack_q4_0(const void* row, int64_t cols, UnpackedRowOf<T> out) {
  const auto* blocks = static_cast<const BlockQ4_0*>(row);
  for (int64_t b = 0; b < cols / 32; ++b) {
    T* w = out.w + 32 * b;
    for (int i = 0; i < 16; ++i) {
      w[i] = T((blocks[b].qs[i] & 15) + kBias);
      w[i + 16] = T((blocks[b].qs[i] >> 4) + kBias);
    }
    out.scale[b] = f16_value(blocks[b].d);
  }
}

template <class T, int kBias>
inline void unpack_q5_0(const void* row, int64_t cols, UnpackedRowOf<T> out) {
  const auto* blocks = static_cast<const BlockQ5_0*>(row);
  for (int64_t b = 0; b < cols / 32; ++b) {
    uint32_t qh;
    std::memcpy(&qh, blocks[b].qh, sizeof(qh));
    T* w = out.w + 32 * b;
    for (int i = 0; i < 16; ++i) {
      w[i] = T(((blocks[b].qs[i] & 15) | ((qh >> i) & 1) << 4) + kBias);
      w[i + 16] = T(((blocks[b].qs[i] >> 4) | ((qh >> (i + 16)) & 1) << 4) + kBias);
    }
    out.scale[b] = f16_value(blocks[b].d);
  }
}

// Q4_1: value = d * q + m: the quants as they are, m as a min of -m (applied in float).
template <class T>
inline void unpack_q4_1(const void* row, int64_t cols, UnpackedRowOf<T> out) {
  const auto* blocks = static_cast<const BlockQ4_1*>(row);
  for (int64_t b = 0; b < cols / 32; ++b) {
    T* w = out.w + 32 * b;
    for (int i = 0; i < 16; ++i) {
      w[i] = T(blocks[b].qs[i] & 15);
      w[i + 16] = T(blocks[b].qs[i] >> 4);
    }
    out.scale[b] = f16_value(blocks[b].d);
    out.min[b] = -f16_value(blocks[b].m);
  }
}

// Q4_K and Q5_K: sub-block j of 32 is group j; value = d * scale_j * q - dmin * min_j. The
// scales and mins of super-block b, for every level's unpacking.
template <class Block>
inline void unpack_k_group_scales(const Block& block, int64_t b, float* scale, float* min) {
  const KScales s = unpack_k_scales(block.scales);
  const float d = f16_value(block.d), dmin = f16_value(block.dmin);
  for (int j = 0; j < 8; ++j) {
    scale[8 * b + j] = d * float(s.scale[j]);
    min[8 * b + j] = dmin * float(s.min[j]);
  }
}

// The quants as they are (the mins are applied in float): both paths store q.
template <class T, bool kFifthBit, class Block>
inline void unpack_q4_q5_k(const void* row, int64_t cols, UnpackedRowOf<T> out) {
  const auto* blocks = static_cast<const Block*>(row);
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const Block& block = blocks[b];
    unpack_k_group_scales(block, b, out.scale, out.min);
    T* w = out.w + kQK_K * b;
    for (int c = 0; c < 4; ++c) {
      for (int i = 0; i < 32; ++i) {
        int lo = block.qs[32 * c + i] & 15, hi = block.qs[32 * c + i] >> 4;
        if constexpr (kFifthBit) {
          lo |= ((block.qh[i] >> (2 * c)) & 1) << 4;
          hi |= ((block.qh[i] >> (2 * c + 1)) & 1) << 4;
        }
        w[64 * c + i] = T(lo);
        w[64 * c + 32 + i] = T(hi);
      }
    }
  }
}

// Q6_K: 16 sub-blocks of 16 (groups of 16); value = d * scale_k * (q - 32).
template <class T, int kBias>
inline void unpack_q6_k(const void* row, int64_t cols, UnpackedRowOf<T> out) {
  const auto* blocks = static_cast<const BlockQ6_K*>(row);
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const BlockQ6_K& block = blocks[b];
    const float d = f16_value(block.d);
    for (int k = 0; k < 16; ++k) out.scale[16 * b + k] = d * float(block.scales[k]);
    T* w = out.w + kQK_K * b;
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = block.ql + 64 * half;
      const uint8_t* qh = block.qh + 32 * half;
      T* wh = w + 128 * half;
      for (int i = 0; i < 32; ++i) {
        wh[i] = T(((ql[i] & 15) | ((qh[i] >> 0) & 3) << 4) + kBias);
        wh[32 + i] = T(((ql[32 + i] & 15) | ((qh[i] >> 2) & 3) << 4) + kBias);
        wh[64 + i] = T(((ql[i] >> 4) | ((qh[i] >> 4) & 3) << 4) + kBias);
        wh[96 + i] = T(((ql[32 + i] >> 4) | ((qh[i] >> 6) & 3) << 4) + kBias);
      }
    }
  }
}

// IQ4_NL, IQ4_XS and MXFP4: the levels themselves are the weights (|w| <= 127); the scale per
// 32 is d (IQ4_NL), d * (sub-block scale - 32) (IQ4_XS) or the block's power of two (MXFP4).
template <class T, int kBias>
inline void unpack_levels_32(const uint8_t* qs, const int8_t* levels, T* w) {
  for (int i = 0; i < 16; ++i) {
    w[i] = T(levels[qs[i] & 15] + kBias);
    w[i + 16] = T(levels[qs[i] >> 4] + kBias);
  }
}

template <class T, int kBias>
inline void unpack_iq4_32(const uint8_t* qs, T* w) {
  unpack_levels_32<T, kBias>(qs, kIq4NlValues, w);
}

template <class T, int kBias>
inline void unpack_mxfp4(const void* row, int64_t cols, UnpackedRowOf<T> out) {
  const auto* blocks = static_cast<const BlockMXFP4*>(row);
  for (int64_t b = 0; b < cols / 32; ++b) {
    unpack_levels_32<T, kBias>(blocks[b].qs, kE2M1Doubled.v, out.w + 32 * b);
    out.scale[b] = mxfp4_scale(blocks[b].e);
  }
}

template <class T, int kBias>
inline void unpack_iq4_nl(const void* row, int64_t cols, UnpackedRowOf<T> out) {
  const auto* blocks = static_cast<const BlockIQ4_NL*>(row);
  for (int64_t b = 0; b < cols / 32; ++b) {
    unpack_iq4_32<T, kBias>(blocks[b].qs, out.w + 32 * b);
    out.scale[b] = f16_value(blocks[b].d);
  }
}

template <class T, int kBias>
inline void unpack_iq4_xs(const void* row, int64_t cols, UnpackedRowOf<T> out) {
  const auto* blocks = static_cast<const BlockIQ4_XS*>(row);
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const float d = f16_value(blocks[b].d);
    for (int sub = 0; sub < 8; ++sub) {
      unpack_iq4_32<T, kBias>(blocks[b].qs + 16 * sub, out.w + kQK_K * b + 32 * sub);
      out.scale[8 * b + sub] = d * float(iq4_xs_sub_scale(blocks[b], sub));
    }
  }
}

// TQ1_0 / TQ2_0: the quants q (0..2, value d · (q - 1)), the block's d for each of its groups.
template <class T, int kBias, class Block, void (*kQuants)(const Block&, uint8_t*)>
inline void unpack_ternary(const void* row, int64_t cols, UnpackedRowOf<T> out) {
  const auto* blocks = static_cast<const Block*>(row);
  uint8_t q[kQK_K];
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    kQuants(blocks[b], q);
    T* w = out.w + kQK_K * b;
    for (int i = 0; i < kQK_K; ++i) w[i] = T(q[i] + kBias);
    for (int g = 0; g < 8; ++g) out.scale[8 * b + g] = f16_value(blocks[b].d);
  }
}

// The grid i-quants: core/iq_blocks.h's integer weights (|w| <= 62) and its scale per group of
// 16 or 32.
template <class T, int kBias, class Block>
inline void unpack_iq_grid(const void* row, int64_t cols, UnpackedRowOf<T> out) {
  constexpr int kGroups = kQK_K / kIqGroup<Block>;
  const auto* blocks = static_cast<const Block*>(row);
  IqWeights weights;
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    iq_weights(blocks[b], weights);
    T* w = out.w + kQK_K * b;
    for (int i = 0; i < kQK_K; ++i) w[i] = T(weights.w[i] + kBias);
    for (int g = 0; g < kGroups; ++g) out.scale[kGroups * b + g] = weights.scale[g];
  }
}

using UnpackRowFn = void (*)(const void* row, int64_t cols, UnpackedRow out);

// The formats with a token-lanes path.
constexpr DType kLanesFormats[] = {
    DType::Q8_0,   DType::Q4_0,    DType::Q5_0,   DType::Q4_1,  DType::Q4_K,    DType::Q5_K,
    DType::Q6_K,   DType::IQ4_NL,  DType::IQ4_XS, DType::MXFP4, DType::TQ1_0,   DType::TQ2_0,
    DType::IQ1_S,  DType::IQ1_M,   DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S, DType::IQ3_XXS,
    DType::IQ3_S};

struct RowUnpacker {
  UnpackRowFn unpack = nullptr;  // nullptr: the format has no token-lanes path
  UnpackShape shape;
};

inline RowUnpacker row_unpacker(DType type) {
  switch (type) {
    case DType::Q8_0:
      return {unpack_q8_0<int16_t, 0>, {32, false}};
    case DType::Q4_0:
      return {unpack_q4_0<int16_t, -8>, {32, false}};
    case DType::Q5_0:
      return {unpack_q5_0<int16_t, -16>, {32, false}};
    case DType::Q4_1:
      return {unpack_q4_1<int16_t>, {32, true}};
    case DType::Q4_K:
      return {unpack_q4_q5_k<int16_t, false, BlockQ4_K>, {32, true}};
    case DType::Q5_K:
      return {unpack_q4_q5_k<int16_t, true, BlockQ5_K>, {32, true}};
    case DType::Q6_K:
      return {unpack_q6_k<int16_t, -32>, {16, false}};
    case DType::IQ4_NL:
      return {unpack_iq4_nl<int16_t, 0>, {32, false}};
    case DType::IQ4_XS:
      return {unpack_iq4_xs<int16_t, 0>, {32, false}};
    case DType::MXFP4:
      return {unpack_mxfp4<int16_t, 0>, {32, false}};
    case DType::TQ1_0:
      return {unpack_ternary<int16_t, -1, BlockTQ1_0, tq1_0_quants>, {32, false}};
    case DType::TQ2_0:
      return {unpack_ternary<int16_t, -1, BlockTQ2_0, tq2_0_quants>, {32, false}};
    default: {
      RowUnpacker grid;  // the grid i-quants, or none
      visit_iq_grid(type, [&](auto f) {
        using Block = typename decltype(f)::Block;
        grid = {unpack_iq_grid<int16_t, 0, Block>, {kIqGroup<Block>, false}};
      });
      return grid;
    }
  }
}

// Room for `rows` unpacked rows of `cols` elements, and where row r lies in it.
inline size_t unpack_scratch_bytes(int64_t rows, int64_t cols) {
  return size_t(rows) * (size_t(cols) * sizeof(int16_t) + 2 * size_t(cols / 16) * sizeof(float));
}

inline UnpackedRow unpacked_row(uint8_t* scratch, int64_t rows, int64_t cols, int64_t r) {
  auto* w = reinterpret_cast<int16_t*>(scratch);
  auto* scale = reinterpret_cast<float*>(scratch + size_t(rows) * size_t(cols) * sizeof(int16_t));
  float* min = scale + rows * (cols / 16);
  return {w + r * cols, scale + r * (cols / 16), min + r * (cols / 16)};
}

}  // namespace
}  // namespace tandem::cpu

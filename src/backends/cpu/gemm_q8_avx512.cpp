// The 8-bit token-lanes path (gemm_q8.h) with AVX-512 VNNI: sixteen weight rows unpacked together
// meet every tile of 16 tokens a chunk of columns at a time (lanes_avx512.h), four rows against a
// pair of tiles (eight against a lone one), so each load of 16 tokens' activation quads feeds
// four vpdpbusd per tile, each with a row's four weights broadcast. Bit for bit the portable
// version: the same exact integer group sums, then the same float operations per lane in the same
// order.
#include "backends/cpu/avx512_intrinsics.h"

#include <algorithm>
#include <cstring>

#include "backends/cpu/gemm_q8.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/lanes_avx512.h"
#include "core/aligned_buffer.h"

namespace tandem::cpu {
namespace {

// ---- unpacking to bytes, vectorized: the same bytes and float scales as gemm_q8.h's ----

inline void store256(uint8_t* p, __m256i v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
}

void unpack8_q8_0_avx512(const void* row, int64_t cols, UnpackedRow8 out) {
  const auto* blocks = static_cast<const BlockQ8_0*>(row);
  const __m256i flip = _mm256_set1_epi8(char(0x80));  // q + 128 as a byte
  for (int64_t b = 0; b < cols / 32; ++b) {
    store256(out.w + 32 * b, _mm256_xor_si256(load256(blocks[b].qs), flip));
    out.scale[b] = f16_value(blocks[b].d);
  }
}

void unpack8_q4_0_avx512(const void* row, int64_t cols, UnpackedRow8 out) {
  const auto* blocks = static_cast<const BlockQ4_0*>(row);
  for (int64_t b = 0; b < cols / 32; ++b) {
    store256(out.w + 32 * b, unpack_nibbles_32(blocks[b].qs));
    out.scale[b] = f16_value(blocks[b].d);
  }
}

void unpack8_q5_0_avx512(const void* row, int64_t cols, UnpackedRow8 out) {
  const auto* blocks = static_cast<const BlockQ5_0*>(row);
  for (int64_t b = 0; b < cols / 32; ++b) {
    uint32_t qh;
    std::memcpy(&qh, blocks[b].qh, sizeof(qh));
    const __m256i low = unpack_nibbles_32(blocks[b].qs);
    store256(out.w + 32 * b, _mm256_mask_add_epi8(low, __mmask32(qh), low, _mm256_set1_epi8(16)));
    out.scale[b] = f16_value(blocks[b].d);
  }
}

// unpack_k_group_scales in one vector: the 8 scales and 8 mins as floats times d and dmin (the
// same products, so the same bits).
template <class Block>
inline void unpack_k_group_scales_avx512(const Block& block, int64_t b, float* scale, float* min) {
  alignas(16) uint32_t words[4];
  unpack_k_scales_words(block.scales, words);
  const __m512 values = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(words))));
  const __m512 factors = _mm512_insertf32x8(_mm512_set1_ps(f16_value(block.d)),
                                            _mm256_set1_ps(f16_value(block.dmin)), 1);
  const __m512 products = _mm512_mul_ps(values, factors);
  _mm256_storeu_ps(scale + 8 * b, _mm512_castps512_ps256(products));
  _mm256_storeu_ps(min + 8 * b, _mm512_extractf32x8_ps(products, 1));
}

template <bool kFifthBit, class Block>
void unpack8_q4_q5_k_avx512(const void* row, int64_t cols, UnpackedRow8 out) {
  const auto* blocks = static_cast<const Block*>(row);
  const __m256i low4 = _mm256_set1_epi8(15), sixteen = _mm256_set1_epi8(16);
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const Block& block = blocks[b];
    unpack_k_group_scales_avx512(block, b, out.scale, out.min);
    uint8_t* u = out.w + kQK_K * b;
    __m256i qh = _mm256_setzero_si256();
    if constexpr (kFifthBit) qh = load256(block.qh);
    for (int c = 0; c < 4; ++c) {
      const __m256i q = load256(block.qs + 32 * c);
      __m256i lo = _mm256_and_si256(q, low4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
      if constexpr (kFifthBit) {
        lo = _mm256_mask_add_epi8(lo, _mm256_test_epi8_mask(qh, _mm256_set1_epi8(char(1 << (2 * c)))),
                                  lo, sixteen);
        hi = _mm256_mask_add_epi8(hi, _mm256_test_epi8_mask(qh, _mm256_set1_epi8(char(2 << (2 * c)))),
                                  hi, sixteen);
      }
      store256(u + 64 * c, lo);
      store256(u + 64 * c + 32, hi);
    }
  }
}

void unpack8_q6_k_avx512(const void* row, int64_t cols, UnpackedRow8 out) {
  const auto* blocks = static_cast<const BlockQ6_K*>(row);
  const __m256i low4 = _mm256_set1_epi8(15);
  const __m256i bits45 = _mm256_set1_epi8(0x30);
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const BlockQ6_K& block = blocks[b];
    const float d = f16_value(block.d);
    for (int k = 0; k < 16; ++k) out.scale[16 * b + k] = d * float(block.scales[k]);
    for (int half = 0; half < 2; ++half) {
      const __m256i ql0 = load256(block.ql + 64 * half);
      const __m256i ql1 = load256(block.ql + 64 * half + 32);
      const __m256i qh = load256(block.qh + 32 * half);
      uint8_t* u = out.w + kQK_K * b + 128 * half;
      // As gemm_q16_avx512.cpp's Q6_K: low 4 bits from ql0 / ql1, bits 4-5 from qh; (A & B) | C.
      store256(u, _mm256_ternarylogic_epi32(ql0, low4, _mm256_and_si256(_mm256_slli_epi16(qh, 4), bits45), 0xEA));
      store256(u + 32, _mm256_ternarylogic_epi32(ql1, low4, _mm256_and_si256(_mm256_slli_epi16(qh, 2), bits45), 0xEA));
      store256(u + 64, _mm256_ternarylogic_epi32(_mm256_srli_epi16(ql0, 4), low4, _mm256_and_si256(qh, bits45), 0xEA));
      store256(u + 96, _mm256_ternarylogic_epi32(_mm256_srli_epi16(ql1, 4), low4,
                                                 _mm256_and_si256(_mm256_srli_epi16(qh, 2), bits45), 0xEA));
    }
  }
}

// The 16 levels + 128 as bytes, in both 128-bit halves, for vpshufb.
inline __m256i iq4_level_bytes() {
  const __m128i levels = _mm_xor_si128(load128(kIq4NlValues), _mm_set1_epi8(char(0x80)));
  return _mm256_broadcastsi128_si256(levels);
}

void unpack8_iq4_nl_avx512(const void* row, int64_t cols, UnpackedRow8 out) {
  const auto* blocks = static_cast<const BlockIQ4_NL*>(row);
  const __m256i levels = iq4_level_bytes();
  for (int64_t b = 0; b < cols / 32; ++b) {
    store256(out.w + 32 * b, _mm256_shuffle_epi8(levels, unpack_nibbles_32(blocks[b].qs)));
    out.scale[b] = f16_value(blocks[b].d);
  }
}

void unpack8_iq4_xs_avx512(const void* row, int64_t cols, UnpackedRow8 out) {
  const auto* blocks = static_cast<const BlockIQ4_XS*>(row);
  const __m256i levels = iq4_level_bytes();
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const float d = f16_value(blocks[b].d);
    for (int sub = 0; sub < 8; ++sub) {
      store256(out.w + kQK_K * b + 32 * sub,
               _mm256_shuffle_epi8(levels, unpack_nibbles_32(blocks[b].qs + 16 * sub)));
      out.scale[8 * b + sub] = d * float(iq4_xs_sub_scale(blocks[b], sub));
    }
  }
}

// The ternary quants q + 7 as bytes (offset 8, as gemm_q8.h's), group by group.
template <class Block, __m512i (*kGroup)(const Block&, int)>
void unpack8_ternary_avx512(const void* row, int64_t cols, UnpackedRow8 out) {
  const auto* blocks = static_cast<const Block*>(row);
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const float d = f16_value(blocks[b].d);
    for (int k = 0; k < 8; ++k) {
      const __m512i u = _mm512_add_epi16(kGroup(blocks[b], k), _mm512_set1_epi16(7));
      store256(out.w + kQK_K * b + 32 * k, _mm512_cvtepi16_epi8(u));
      out.scale[8 * b + k] = d;
    }
  }
}

// The grid i-quants' signed weights plus 128 (a flipped top bit) as bytes, chunk by chunk.
template <class Block>
void unpack8_iq_grid_avx512(const void* row, int64_t cols, UnpackedRow8 out) {
  constexpr int kGroups = kQK_K / kIqGroup<Block>;
  const auto* blocks = static_cast<const Block*>(row);
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    iq_scales(blocks[b], out.scale + kGroups * b);
    for (int k = 0; k < 8; ++k)
      store256(out.w + kQK_K * b + 32 * k,
               _mm256_xor_si256(iq_chunk_bytes<Block>(iq_chunk(blocks[b], k)), _mm256_set1_epi8(char(0x80))));
  }
}

UnpackRow8Fn avx512_unpacker8(DType type) {
  switch (type) {
    case DType::Q8_0:
      return unpack8_q8_0_avx512;
    case DType::Q4_0:
      return unpack8_q4_0_avx512;
    case DType::Q5_0:
      return unpack8_q5_0_avx512;
    case DType::Q4_K:
      return unpack8_q4_q5_k_avx512<false, BlockQ4_K>;
    case DType::Q5_K:
      return unpack8_q4_q5_k_avx512<true, BlockQ5_K>;
    case DType::Q6_K:
      return unpack8_q6_k_avx512;
    case DType::IQ4_NL:
      return unpack8_iq4_nl_avx512;
    case DType::IQ4_XS:
      return unpack8_iq4_xs_avx512;
    case DType::TQ1_0:
      return unpack8_ternary_avx512<BlockTQ1_0, tq1_0_group>;
    case DType::TQ2_0:
      return unpack8_ternary_avx512<BlockTQ2_0, tq2_0_group>;
    default: {  // the grid i-quants', or for formats without one of their own here the portable one
      UnpackRow8Fn unpack = row_unpacker8(type).unpack;
      visit_iq_grid(type, [&](auto f) { unpack = unpack8_iq_grid_avx512<typename decltype(f)::Block>; });
      return unpack;
    }
  }
}

// ---- the tile of activations ----

// build_q8_tile's tile with the quads transposed in registers. A token's block of 32 activations
// is 8 quads; tokens t and t + 8 share a register (low and high halves), and an 8x8 transpose of
// 32-bit words in each half leaves quad i of all 16 tokens in order. The half sums come from the
// transposed quads (vpdpbusd against ones: exact), so every byte is the portable builder's; it
// took a fifth of a 64-token product's time as a scalar loop.
void build_q8_tile_avx512(const uint8_t* act, size_t act_stride, int64_t first, int64_t n,
                          int64_t cols, uint8_t* tile) {
  const Q8Tile view = q8_tile(tile, cols);
  auto* quads = const_cast<int32_t*>(view.quads);
  auto* d = const_cast<float*>(view.d);
  auto* sum32 = const_cast<float*>(view.sum32);
  auto* isum16 = const_cast<int32_t*>(view.isum16);
  const ActBlockQ8* rows[kLanes] = {};
  for (int64_t t = 0; t < n; ++t)
    rows[t] = reinterpret_cast<const ActBlockQ8*>(act + size_t(first + t) * act_stride);
  auto block_qs = [&](int t, int64_t b) {
    return rows[t] ? load256(rows[t][b].qs) : _mm256_setzero_si256();
  };
  const __m512i ones = _mm512_set1_epi8(1);
  // 64-bit pieces of (u, v): the first 128 bits of each half of u and v, or the second ones.
  const __m512i first_halves = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0);
  const __m512i second_halves = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
  for (int64_t b = 0; b < cols / 32; ++b) {
    __m512i r[8];
    for (int t = 0; t < 8; ++t)
      r[t] = _mm512_inserti64x4(_mm512_castsi256_si512(block_qs(t, b)), block_qs(t + 8, b), 1);
    __m512i u[8];
    for (int p = 0; p < 8; p += 4) {  // tokens p .. p + 3 (and 8 more)
      const __m512i t0 = _mm512_unpacklo_epi32(r[p], r[p + 1]),
                    t1 = _mm512_unpackhi_epi32(r[p], r[p + 1]);
      const __m512i t2 = _mm512_unpacklo_epi32(r[p + 2], r[p + 3]),
                    t3 = _mm512_unpackhi_epi32(r[p + 2], r[p + 3]);
      // u[p + j], 128-bit lane l: quad j + 4 (l % 2) of tokens p .. p + 3 (+ 8 in lanes 2 and 3)
      u[p] = _mm512_unpacklo_epi64(t0, t2);
      u[p + 1] = _mm512_unpackhi_epi64(t0, t2);
      u[p + 2] = _mm512_unpacklo_epi64(t1, t3);
      u[p + 3] = _mm512_unpackhi_epi64(t1, t3);
    }
    __m512i sums[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
    for (int j = 0; j < 4; ++j) {
      const __m512i low = _mm512_permutex2var_epi64(u[j], first_halves, u[j + 4]);    // quad j
      const __m512i high = _mm512_permutex2var_epi64(u[j], second_halves, u[j + 4]);  // quad j + 4
      _mm512_storeu_si512(quads + (8 * b + j) * kLanes, low);
      _mm512_storeu_si512(quads + (8 * b + j + 4) * kLanes, high);
      sums[0] = _mm512_dpbusd_epi32(sums[0], ones, low);
      sums[1] = _mm512_dpbusd_epi32(sums[1], ones, high);
    }
    _mm512_storeu_si512(isum16 + 2 * b * kLanes, sums[0]);
    _mm512_storeu_si512(isum16 + (2 * b + 1) * kLanes, sums[1]);
    for (int t = 0; t < kLanes; ++t) {
      d[b * kLanes + t] = rows[t] ? rows[t][b].d : 0.0f;
      sum32[b * kLanes + t] = rows[t] ? rows[t][b].d * float(rows[t][b].sum) : 0.0f;
    }
  }
}

// ---- the token-lanes product ----

// kRows unpacked rows against kTiles consecutive tiles; lane t of out[r][k] is token t of tile k's
// result. Each activation load feeds kRows vpdpbusd and each broadcast weight quad kTiles, with
// kRows * kTiles independent sums in flight: one tile of four rows left this CPU's two VNNI pipes
// half idle, waiting on four dependency chains and on five loads for every four products (a
// 64-token Q4_K product, one thread: 938 -> 800 us with two tiles, 635 with the group loop
// unrolled and the tiles built in registers; three tiles measured no better than two). The float
// steps per lane are unchanged, so the bits do not depend on how many tiles go together.
// kStride: how far apart a row's consecutive quads and group scales are (1 for unpacked rows; 16
// for an unpacked interleaved group, whose 16 rows' quads and scales lie side by side).
// Groups [first_group, end_group) are added to `out`, so a row's sums can run a chunk of columns
// at a time (the float steps stay per group, in group order).
template <int kGroup, bool kMins, int kOffsetShift, int kRows, int kTiles, int kStride = 1>
inline void tile_rows8_groups(const UnpackedRow8* w, const Q8Tile* x, int64_t first_group,
                              int64_t end_group, __m512 (*out)[kTiles]) {
  for (int64_t g = first_group; g < end_group; ++g) {
    // -o Σ x of the group, per lane: where each row's sum starts.
    __m512i start[kTiles];
    for (int k = 0; k < kTiles; ++k) {
      start[k] = _mm512_setzero_si512();
      if constexpr (kOffsetShift > 0) {
        const int64_t first16 = g * kGroup / 16;
        __m512i sum = _mm512_loadu_si512(x[k].isum16 + first16 * kLanes);
        if constexpr (kGroup == 32)
          sum = _mm512_add_epi32(sum, _mm512_loadu_si512(x[k].isum16 + (first16 + 1) * kLanes));
        start[k] = _mm512_sub_epi32(start[k], _mm512_slli_epi32(sum, kOffsetShift));
      }
    }
    __m512i acc[kRows][kTiles];
    for (int r = 0; r < kRows; ++r)
      for (int k = 0; k < kTiles; ++k) acc[r][k] = start[k];
    const int64_t first_quad = g * kGroup / 4;
    // Unrolled, so that the sums stay in their registers (as gemm_q16_avx512.cpp's).
#pragma GCC unroll 8
    for (int i = 0; i < kGroup / 4; ++i) {
      __m512i xv[kTiles];
      for (int k = 0; k < kTiles; ++k)
        xv[k] = _mm512_loadu_si512(x[k].quads + (first_quad + i) * kLanes);
      for (int r = 0; r < kRows; ++r) {
        const __m512i wq = broadcast_4_bytes(w[r].w + 4 * kStride * (first_quad + i));
        for (int k = 0; k < kTiles; ++k) acc[r][k] = _mm512_dpbusd_epi32(acc[r][k], wq, xv[k]);
      }
    }
    const int64_t block = g * kGroup / 32;
    for (int k = 0; k < kTiles; ++k) {
      const __m512 dx = _mm512_loadu_ps(x[k].d + block * kLanes);
      for (int r = 0; r < kRows; ++r)
        out[r][k] =
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][k]),
                            _mm512_mul_ps(_mm512_set1_ps(w[r].scale[g * kStride]), dx), out[r][k]);
      if constexpr (kMins) {
        const __m512 sums = _mm512_loadu_ps(x[k].sum32 + block * kLanes);
        for (int r = 0; r < kRows; ++r)
          out[r][k] = _mm512_fnmadd_ps(_mm512_set1_ps(w[r].min[g * kStride]), sums, out[r][k]);
      }
    }
  }
}

template <int kGroup, bool kMins, int kOffsetShift, int kRows, int kTiles, int kStride = 1>
inline void tile_rows8(const UnpackedRow8* w, const Q8Tile* x, int64_t cols,
                       __m512 (*out)[kTiles]) {
  for (int r = 0; r < kRows; ++r)
    for (int k = 0; k < kTiles; ++k) out[r][k] = _mm512_setzero_ps();
  tile_rows8_groups<kGroup, kMins, kOffsetShift, kRows, kTiles, kStride>(w, x, 0, cols / kGroup,
                                                                         out);
}

// kTiles tiles from the one at token `first` against kRows unpacked rows, stored to m.output.
template <int kGroup, bool kMins, int kOffsetShift, int kRows, int kTiles, int kStride = 1>
void rows_against_tiles(const LanesMatmul& m, const UnpackedRow8* w, int64_t row, int64_t first) {
  const size_t tile_bytes = q8_tile_bytes(m.cols);
  Q8Tile x[kTiles];
  for (int k = 0; k < kTiles; ++k)
    x[k] = q8_tile(m.tiles + size_t(first / kLanes + k) * tile_bytes, m.cols);
  __m512 out[kRows][kTiles];
  tile_rows8<kGroup, kMins, kOffsetShift, kRows, kTiles, kStride>(w, x, m.cols, out);
  store_lanes<kRows, kTiles>(m, out, row, first);
}

// kRows unpacked rows (`row` ..) against every tile: two at a time, then the last one alone.
template <int kGroup, bool kMins, int kOffsetShift, int kRows, int kStride = 1>
void rows_against_every_tile(const LanesMatmul& m, const UnpackedRow8* w, int64_t row) {
  int64_t first = 0;
  for (; first + kLanes < m.n_tokens; first += 2 * kLanes)
    rows_against_tiles<kGroup, kMins, kOffsetShift, kRows, 2, kStride>(m, w, row, first);
  if (first < m.n_tokens)
    rows_against_tiles<kGroup, kMins, kOffsetShift, kRows, 1, kStride>(m, w, row, first);
}

// Sixteen unpacked rows against every tile (lanes_avx512.h's driver, these products inside).
template <int kGroup, bool kMins, int kOffsetShift, int kStride>
void sixteen_rows8(const LanesMatmul& m, const UnpackedRow8* w, int64_t row, __m512* partial) {
  sixteen_rows_against_every_tile<kGroup, 512>(
      m, row, partial, q8_tile_bytes(m.cols), q8_tile,
      [&](auto rows, auto tiles, int r0, const Q8Tile* x, int64_t first, int64_t end, auto out) {
        tile_rows8_groups<kGroup, kMins, kOffsetShift, rows, tiles, kStride>(w + r0, x, first, end,
                                                                             out);
      });
}

// Rows `row` .. `row + kRows - 1` of `m`, unpacked into `scratch`, against every tile.
template <int kGroup, bool kMins, int kOffsetShift, int kRows>
void rows_against_tiles8(const LanesMatmul& m, int64_t row, uint8_t* scratch) {
  const UnpackRow8Fn unpack = avx512_unpacker8(m.type);
  UnpackedRow8 w[kRows];
  for (int r = 0; r < kRows; ++r) {
    w[r] = unpacked_row8(scratch, kRows, m.cols, r);
    unpack(m.weights + size_t(row + r) * m.weight_stride, m.cols, w[r]);
  }
  prefetch_rows(m.weights + size_t(row + kRows) * m.weight_stride, size_t(kRows) * m.weight_stride);
  rows_against_every_tile<kGroup, kMins, kOffsetShift, kRows>(m, w, row);
}

// Rows [first_row, last_row) of `m`: sixteen at a time, then four, then one.
template <int kGroup, bool kMins, int kOffsetShift>
void lanes8_rows(const LanesMatmul& m, int64_t first_row, int64_t last_row) {
  constexpr int kRows = 4;
  thread_local AlignedBuffer scratch;
  const size_t unpacked_bytes = unpack8_scratch_bytes(16, m.cols);
  if (scratch.size() < unpacked_bytes + partial_sums_bytes(m.n_tokens))
    scratch = AlignedBuffer(unpacked_bytes + partial_sums_bytes(m.n_tokens));
  auto* partial = reinterpret_cast<__m512*>(scratch.data() + unpacked_bytes);
  const UnpackRow8Fn unpack = avx512_unpacker8(m.type);
  int64_t row = first_row;
  for (; row + 16 <= last_row; row += 16) {
    UnpackedRow8 w[16];
    for (int r = 0; r < 16; ++r) {
      w[r] = unpacked_row8(scratch.data(), 16, m.cols, r);
      unpack(m.weights + size_t(row + r) * m.weight_stride, m.cols, w[r]);
    }
    prefetch_rows(m.weights + size_t(row + 16) * m.weight_stride, size_t(16) * m.weight_stride);
    sixteen_rows8<kGroup, kMins, kOffsetShift, 1>(m, w, row, partial);
  }
  for (; row + kRows <= last_row; row += kRows)
    rows_against_tiles8<kGroup, kMins, kOffsetShift, kRows>(m, row, scratch.data());
  for (; row < last_row; ++row) rows_against_tiles8<kGroup, kMins, kOffsetShift, 1>(m, row, scratch.data());
}

// ---- interleaved groups (Q8_0_R16, Q5_0_R16, Q4_K_R16; core/blocks.h) ----
// A group of 16 rows unpacked whole into quads [cols / 4][16 rows] (row r's four bytes of
// elements 4q .. 4q + 3 in dword r of quad q: one vector per quad) and scales and mins
// [cols / 32][16 rows]; the 16 rows then go against the tiles as sixteen_rows8 runs them, reading
// with a stride of 16. The bytes and float scales are the plain unpackers' (gemm_q8.h), so the
// results are bit for bit those of the plain format's rows.

struct UnpackedGroup8 {
  int32_t* quads;  // [cols / 4][16]
  float* scale;    // [cols / 32][16]
  float* min;      // [cols / 32][16]
};

inline size_t unpacked_group8_bytes(int64_t cols) {
  return size_t(cols) * 16 + 2 * size_t(cols / 32) * 16 * sizeof(float);
}

inline UnpackedGroup8 unpacked_group8(uint8_t* scratch, int64_t cols) {
  auto* quads = reinterpret_cast<int32_t*>(scratch);
  auto* scale = reinterpret_cast<float*>(scratch + size_t(cols) * 16);
  return {quads, scale, scale + (cols / 32) * 16};
}

inline __m512 halves_to_float8(const uint16_t* p) {
  return _mm512_cvtph_ps(load256(p));
}

inline __m512 bytes_to_float8(const uint8_t* p) {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// Two chunks in pair layout (16 rows x 2 bytes each, one after the other) as 16 rows' quads: row r
// takes its pair from the first chunk, then its pair from the second.
inline __m512i pairs_to_quads(const int8_t* chunks) {
  const __m512i index = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24,
                                         8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(index, _mm512_loadu_si512(chunks));
}

void unpack8_group_q8_0(const void* group, int64_t cols, UnpackedGroup8 out) {
  const auto* blocks = static_cast<const BlockQ8_0_R16*>(group);
  const __m512i flip = _mm512_set1_epi8(char(0x80));  // q + 128 as a byte
  for (int64_t b = 0; b < cols / 32; ++b) {
    _mm512_storeu_ps(out.scale + 16 * b, halves_to_float8(blocks[b].d));
    for (int q = 0; q < 8; ++q)  // quad q: chunks 2q, 2q + 1 (elements 4q .. 4q + 3)
      _mm512_storeu_si512(out.quads + 16 * (8 * b + q),
                          _mm512_xor_si512(pairs_to_quads(blocks[b].qs + 64 * q), flip));
  }
}

// A chunk of 16 rows x 2 bytes whose low nibbles are elements 4c, 4c + 1 and high nibbles
// 4c + 2, 4c + 3 of each row: row r's quad in dword r.
inline __m512i nibble_pairs_to_quads(const uint8_t* chunk) {
  const __m512i x = _mm512_cvtepu16_epi32(load256(chunk));
  const __m512i low = _mm512_set1_epi32(0x0F0F);
  return _mm512_or_si512(_mm512_and_si512(x, low),
                         _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(x, 4), low), 16));
}

void unpack8_group_q4_k(const void* group, int64_t cols, UnpackedGroup8 out) {
  const auto* blocks = static_cast<const BlockQ4_K_R16*>(group);
  for (int64_t s = 0; s < cols / kQK_K; ++s) {
    const BlockQ4_K_R16& block = blocks[s];
    const __m512 d = halves_to_float8(block.d), dmin = halves_to_float8(block.dmin);
    for (int j = 0; j < 8; ++j) {
      const int64_t g = 8 * s + j;
      _mm512_storeu_ps(out.scale + 16 * g, _mm512_mul_ps(d, bytes_to_float8(block.scales[j])));
      _mm512_storeu_ps(out.min + 16 * g, _mm512_mul_ps(dmin, bytes_to_float8(block.mins[j])));
      for (int c = 0; c < 8; ++c)
        _mm512_storeu_si512(out.quads + 16 * (8 * g + c),
                            nibble_pairs_to_quads(block.qs[j] + 32 * c));
    }
  }
}

void unpack8_group_q5_0(const void* group, int64_t cols, UnpackedGroup8 out) {
  const auto* blocks = static_cast<const BlockQ5_0_R16*>(group);
  // Row r's fifth bits are bits 2r, 2r + 1 of each mask: shifted down per lane, they become bit 4
  // of bytes 0, 1 (elements 4c, 4c + 1) and, from the second mask, of bytes 2, 3.
  const __m512i shifts =
      _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i one = _mm512_set1_epi32(1), two = _mm512_set1_epi32(2);
  for (int64_t b = 0; b < cols / 32; ++b) {
    const BlockQ5_0_R16& block = blocks[b];
    _mm512_storeu_ps(out.scale + 16 * b, halves_to_float8(block.d));
    for (int c = 0; c < 8; ++c) {
      const __m512i lo_bits = _mm512_srlv_epi32(_mm512_set1_epi32(int(block.qh[c][0])), shifts);
      const __m512i hi_bits = _mm512_srlv_epi32(_mm512_set1_epi32(int(block.qh[c][1])), shifts);
      const __m512i fifth =
          _mm512_or_si512(_mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(lo_bits, one), 4),
                                          _mm512_slli_epi32(_mm512_and_si512(lo_bits, two), 11)),
                          _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(hi_bits, one), 20),
                                          _mm512_slli_epi32(_mm512_and_si512(hi_bits, two), 27)));
      _mm512_storeu_si512(out.quads + 16 * (8 * b + c),
                          _mm512_or_si512(nibble_pairs_to_quads(block.qs[c]), fifth));
    }
  }
}

using UnpackGroup8Fn = void (*)(const void* group, int64_t cols, UnpackedGroup8 out);

// Rows [first_row, last_row) (multiples of 16) of an interleaved matrix: each group unpacked once,
// then against every tile (sixteen_rows8).
template <UnpackGroup8Fn kUnpack, bool kMins, int kOffsetShift>
void lanes8_groups(const LanesMatmul& m, int64_t first_row, int64_t last_row) {
  thread_local AlignedBuffer scratch;
  if (scratch.size() < unpacked_group8_bytes(m.cols) + partial_sums_bytes(m.n_tokens))
    scratch = AlignedBuffer(unpacked_group8_bytes(m.cols) + partial_sums_bytes(m.n_tokens));
  const UnpackedGroup8 unpacked = unpacked_group8(scratch.data(), m.cols);
  auto* partial = reinterpret_cast<__m512*>(scratch.data() + unpacked_group8_bytes(m.cols));
  UnpackedRow8 w[16];
  for (int r = 0; r < 16; ++r)
    w[r] = {reinterpret_cast<uint8_t*>(unpacked.quads + r), unpacked.scale + r, unpacked.min + r};
  for (int64_t row = first_row; row < last_row; row += 16) {
    kUnpack(m.weights + size_t(row) * m.weight_stride, m.cols, unpacked);
    sixteen_rows8<32, kMins, kOffsetShift, 16>(m, w, row, partial);
  }
}

}  // namespace

void fill_avx512_lanes8_kernels(KernelTable& table) {
  for (DType type : kLanesFormats)
    table.lanes8[size_t(type)] = lanes8_kernel_for(row_unpacker8(type).shape, [](auto v) -> LanesRowsFn {
      using V = decltype(v);
      return lanes8_rows<V::group, V::mins, V::offset_shift>;
    });
  table.build_tile8 = build_q8_tile_avx512;
  // Offsets as row_unpacker8's for the base formats: Q8_0 128, Q5_0 16, Q4_K none (mins).
  table.group_lanes8[size_t(DType::Q8_0)] = lanes8_groups<unpack8_group_q8_0, false, 7>;
  table.group_lanes8[size_t(DType::Q5_0)] = lanes8_groups<unpack8_group_q5_0, false, 4>;
  table.group_lanes8[size_t(DType::Q4_K)] = lanes8_groups<unpack8_group_q4_k, true, 0>;
}

}  // namespace tandem::cpu

// The token-lanes path (gemm_q16.h) with AVX-512 VNNI: sixteen weight rows unpacked together meet
// every tile of 16 tokens a chunk of columns at a time (lanes_avx512.h), four rows against a pair
// of tiles (eight against a lone one), so each load of 16 tokens' activation pairs feeds four
// vpdpwssd, and each weight pair is a broadcast memory operand. Bit for bit the portable version:
// the same exact integer group sums, then the same float operations per lane in the same order.
#include "backends/cpu/avx512_intrinsics.h"

#include <algorithm>
#include <cstring>

#include "backends/cpu/gemm_q16.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/lanes_avx512.h"
#include "core/aligned_buffer.h"

namespace tandem::cpu {
namespace {

// ---- unpacking, vectorized: the same int16 values and float scales as gemm_q16.h's ----

inline void store512(int16_t* p, __m512i v) {
  _mm512_storeu_si512(p, v);
}

// The 32 nibbles of 16 bytes as int16 in element order (element j in the low nibble of byte j,
// element j + 16 in the high one).
inline __m512i nibbles_16(const uint8_t* qs) {
  const __m512i shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
  const __m512i words = _mm512_cvtepu8_epi16(
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs))));
  return _mm512_and_si512(_mm512_srlv_epi16(words, shift), _mm512_set1_epi16(15));
}

void unpack_q8_0_avx512(const void* row, int64_t cols, UnpackedRow out) {
  const auto* blocks = static_cast<const BlockQ8_0*>(row);
  for (int64_t b = 0; b < cols / 32; ++b) {
    store512(out.w + 32 * b, _mm512_cvtepi8_epi16(load256(blocks[b].qs)));
    out.scale[b] = f16_value(blocks[b].d);
  }
}

void unpack_q4_0_avx512(const void* row, int64_t cols, UnpackedRow out) {
  const auto* blocks = static_cast<const BlockQ4_0*>(row);
  for (int64_t b = 0; b < cols / 32; ++b) {
    store512(out.w + 32 * b, _mm512_sub_epi16(nibbles_16(blocks[b].qs), _mm512_set1_epi16(8)));
    out.scale[b] = f16_value(blocks[b].d);
  }
}

void unpack_q5_0_avx512(const void* row, int64_t cols, UnpackedRow out) {
  const auto* blocks = static_cast<const BlockQ5_0*>(row);
  for (int64_t b = 0; b < cols / 32; ++b) {
    uint32_t qh;
    std::memcpy(&qh, blocks[b].qh, sizeof(qh));
    // q - 16 = nibble + 16 * bit - 16: subtract 16 where bit i of qh is clear.
    const __m512i low = nibbles_16(blocks[b].qs);
    store512(out.w + 32 * b, _mm512_mask_sub_epi16(low, __mmask32(~qh), low, _mm512_set1_epi16(16)));
    out.scale[b] = f16_value(blocks[b].d);
  }
}

template <bool kFifthBit, class Block>
void unpack_q4_q5_k_avx512(const void* row, int64_t cols, UnpackedRow out) {
  const auto* blocks = static_cast<const Block*>(row);
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const Block& block = blocks[b];
    unpack_k_group_scales(block, b, out.scale, out.min);
    int16_t* w = out.w + kQK_K * b;
    __m256i qh = _mm256_setzero_si256();
    if constexpr (kFifthBit) qh = load256(block.qh);
    for (int c = 0; c < 4; ++c) {
      const __m512i q = _mm512_cvtepu8_epi16(load256(block.qs + 32 * c));
      __m512i lo = _mm512_and_si512(q, _mm512_set1_epi16(15));
      __m512i hi = _mm512_srli_epi16(q, 4);
      if constexpr (kFifthBit) {
        const __mmask32 h_lo = _mm256_test_epi8_mask(qh, _mm256_set1_epi8(char(1 << (2 * c))));
        const __mmask32 h_hi = _mm256_test_epi8_mask(qh, _mm256_set1_epi8(char(2 << (2 * c))));
        lo = _mm512_mask_add_epi16(lo, h_lo, lo, _mm512_set1_epi16(16));
        hi = _mm512_mask_add_epi16(hi, h_hi, hi, _mm512_set1_epi16(16));
      }
      store512(w + 64 * c, lo);
      store512(w + 64 * c + 32, hi);
    }
  }
}

void unpack_q6_k_avx512(const void* row, int64_t cols, UnpackedRow out) {
  const auto* blocks = static_cast<const BlockQ6_K*>(row);
  const __m256i low4 = _mm256_set1_epi8(15);
  const __m256i bits45 = _mm256_set1_epi8(0x30);
  const __m256i offset = _mm256_set1_epi8(32);
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const BlockQ6_K& block = blocks[b];
    const float d = f16_value(block.d);
    for (int k = 0; k < 16; ++k) out.scale[16 * b + k] = d * float(block.scales[k]);
    for (int half = 0; half < 2; ++half) {
      const __m256i ql0 = load256(block.ql + 64 * half);
      const __m256i ql1 = load256(block.ql + 64 * half + 32);
      const __m256i qh = load256(block.qh + 32 * half);
      // Element 32p + i of the half: low 4 bits from ql0 / ql1 (low nibble for p < 2, high for
      // p >= 2), bits 4-5 from bits 2p, 2p + 1 of qh[i]. (A & B) | C = 0xEA.
      const __m256i q[4] = {
          _mm256_ternarylogic_epi32(ql0, low4, _mm256_and_si256(_mm256_slli_epi16(qh, 4), bits45),
                                    0xEA),
          _mm256_ternarylogic_epi32(ql1, low4, _mm256_and_si256(_mm256_slli_epi16(qh, 2), bits45),
                                    0xEA),
          _mm256_ternarylogic_epi32(_mm256_srli_epi16(ql0, 4), low4, _mm256_and_si256(qh, bits45),
                                    0xEA),
          _mm256_ternarylogic_epi32(_mm256_srli_epi16(ql1, 4), low4,
                                    _mm256_and_si256(_mm256_srli_epi16(qh, 2), bits45), 0xEA),
      };
      for (int p = 0; p < 4; ++p)
        store512(out.w + kQK_K * b + 128 * half + 32 * p,
                 _mm512_cvtepi8_epi16(_mm256_sub_epi8(q[p], offset)));
    }
  }
}

// The 16 levels as int16 (lanes 16..31 unused: indices are 4 bits), for vpermw.
inline __m512i iq4_level_table() {
  return _mm512_cvtepi8_epi16(
      _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4NlValues))));
}

// The 32 levels of 16 bytes of IQ4 indices, as int16 in element order (one vpermw lookup).
inline __m512i iq4_levels_16(const uint8_t* qs, __m512i levels) {
  return _mm512_permutexvar_epi16(nibbles_16(qs), levels);
}

void unpack_iq4_nl_avx512(const void* row, int64_t cols, UnpackedRow out) {
  const auto* blocks = static_cast<const BlockIQ4_NL*>(row);
  const __m512i levels = iq4_level_table();
  for (int64_t b = 0; b < cols / 32; ++b) {
    store512(out.w + 32 * b, iq4_levels_16(blocks[b].qs, levels));
    out.scale[b] = f16_value(blocks[b].d);
  }
}

void unpack_iq4_xs_avx512(const void* row, int64_t cols, UnpackedRow out) {
  const auto* blocks = static_cast<const BlockIQ4_XS*>(row);
  const __m512i levels = iq4_level_table();
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const float d = f16_value(blocks[b].d);
    for (int sub = 0; sub < 8; ++sub) {
      store512(out.w + kQK_K * b + 32 * sub, iq4_levels_16(blocks[b].qs + 16 * sub, levels));
      out.scale[8 * b + sub] = d * float(iq4_xs_sub_scale(blocks[b], sub));
    }
  }
}

// The ternary quants less one (the digits) as int16, group by group.
template <class Block, __m512i (*kGroup)(const Block&, int)>
void unpack_ternary_avx512(const void* row, int64_t cols, UnpackedRow out) {
  const auto* blocks = static_cast<const Block*>(row);
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const float d = f16_value(blocks[b].d);
    for (int k = 0; k < 8; ++k) {
      store512(out.w + kQK_K * b + 32 * k,
               _mm512_sub_epi16(kGroup(blocks[b], k), _mm512_set1_epi16(1)));
      out.scale[8 * b + k] = d;
    }
  }
}

// The grid i-quants' signed weights as int16, chunk by chunk.
template <class Block>
void unpack_iq_grid_avx512(const void* row, int64_t cols, UnpackedRow out) {
  constexpr int kGroups = kQK_K / kIqGroup<Block>;
  const auto* blocks = static_cast<const Block*>(row);
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    iq_scales(blocks[b], out.scale + kGroups * b);
    for (int k = 0; k < 8; ++k)
      store512(out.w + kQK_K * b + 32 * k, _mm512_cvtepi8_epi16(iq_chunk_bytes<Block>(iq_chunk(blocks[b], k))));
  }
}

UnpackRowFn avx512_unpacker(DType type) {
  switch (type) {
    case DType::Q8_0:
      return unpack_q8_0_avx512;
    case DType::Q4_0:
      return unpack_q4_0_avx512;
    case DType::Q5_0:
      return unpack_q5_0_avx512;
    case DType::Q4_K:
      return unpack_q4_q5_k_avx512<false, BlockQ4_K>;
    case DType::Q5_K:
      return unpack_q4_q5_k_avx512<true, BlockQ5_K>;
    case DType::Q6_K:
      return unpack_q6_k_avx512;
    case DType::IQ4_NL:
      return unpack_iq4_nl_avx512;
    case DType::IQ4_XS:
      return unpack_iq4_xs_avx512;
    case DType::TQ1_0:
      return unpack_ternary_avx512<BlockTQ1_0, tq1_0_group>;
    case DType::TQ2_0:
      return unpack_ternary_avx512<BlockTQ2_0, tq2_0_group>;
    default: {  // the grid i-quants', or for formats without one of their own here the portable one
      UnpackRowFn unpack = row_unpacker(type).unpack;
      visit_iq_grid(type, [&](auto f) { unpack = unpack_iq_grid_avx512<typename decltype(f)::Block>; });
      return unpack;
    }
  }
}

// ---- the token-lanes product ----

// kRows unpacked rows (row r at w[r]) against kTiles consecutive tiles; lane t of out[r][k] is
// token t of tile k's result. kStride 1: each row unpacked on its own (pair p at w[r].w + 2p,
// group g's scale at w[r].scale[g]); kStride 16: a group of 16 interleaved rows unpacked
// together, pairs and scales of the 16 rows side by side (pair p at w[r].w + 32p, scale at
// w[r].scale[16g]). Two tiles keep eight sums in flight and reuse each broadcast weight pair, as
// gemm_q8_avx512.cpp's; the float steps per lane do not depend on kTiles.
// Groups [first_group, end_group) are added to `out` (lanes_avx512.h runs a chunk of columns at
// a time).
template <int kGroup, bool kMins, int kRows, int kStride, int kTiles>
inline void tile_rows_groups(const UnpackedRow* w, const Q16Tile* x, int64_t first_group,
                             int64_t end_group, __m512 (*out)[kTiles]) {
  for (int64_t g = first_group; g < end_group; ++g) {
    __m512i acc[kRows][kTiles];
    for (int r = 0; r < kRows; ++r)
      for (int k = 0; k < kTiles; ++k) acc[r][k] = _mm512_setzero_si512();
    const int64_t first_pair = g * kGroup / 2;
    // Unrolled, so that the sums stay in their registers (GCC otherwise copied every one in and
    // out of a second register each step).
#pragma GCC unroll 16
    for (int i = 0; i < kGroup / 2; ++i) {
      __m512i xv[kTiles];
      for (int k = 0; k < kTiles; ++k)
        xv[k] = _mm512_loadu_si512(x[k].pairs + (first_pair + i) * kLanes);
      for (int r = 0; r < kRows; ++r) {
        const __m512i wp = broadcast_4_bytes(w[r].w + 2 * kStride * (first_pair + i));
        for (int k = 0; k < kTiles; ++k) acc[r][k] = _mm512_dpwssd_epi32(acc[r][k], wp, xv[k]);
      }
    }
    const int64_t block = g * kGroup / 32;
    for (int k = 0; k < kTiles; ++k) {
      const __m512 dx = _mm512_loadu_ps(x[k].d + block * kLanes);
      for (int r = 0; r < kRows; ++r)
        out[r][k] =
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][k]),
                            _mm512_mul_ps(_mm512_set1_ps(w[r].scale[kStride * g]), dx), out[r][k]);
      if constexpr (kMins) {
        const __m512 sums = _mm512_loadu_ps(x[k].sum32 + block * kLanes);
        for (int r = 0; r < kRows; ++r)
          out[r][k] = _mm512_fnmadd_ps(_mm512_set1_ps(w[r].min[kStride * g]), sums, out[r][k]);
      }
    }
  }
}

template <int kGroup, bool kMins, int kRows, int kStride, int kTiles>
inline void tile_rows(const UnpackedRow* w, const Q16Tile* x, int64_t cols, __m512 (*out)[kTiles]) {
  for (int r = 0; r < kRows; ++r)
    for (int k = 0; k < kTiles; ++k) out[r][k] = _mm512_setzero_ps();
  tile_rows_groups<kGroup, kMins, kRows, kStride, kTiles>(w, x, 0, cols / kGroup, out);
}

// Sixteen unpacked rows against every tile (lanes_avx512.h's driver, these products inside).
template <int kGroup, bool kMins, int kStride>
void sixteen_rows16(const LanesMatmul& m, const UnpackedRow* w, int64_t row, __m512* partial) {
  sixteen_rows_against_every_tile<kGroup, 256>(
      m, row, partial, q16_tile_bytes(m.cols), q16_tile,
      [&](auto rows, auto tiles, int r0, const Q16Tile* x, int64_t first, int64_t end, auto out) {
        tile_rows_groups<kGroup, kMins, rows, kStride, tiles>(w + r0, x, first, end, out);
      });
}

// kTiles tiles from the one at token `first` against unpacked rows `row` .. `row + kRows - 1`.
template <int kGroup, bool kMins, int kRows, int kStride, int kTiles>
void unpacked_against(const LanesMatmul& m, int64_t row, const UnpackedRow* w, int64_t first) {
  const size_t tile_bytes = q16_tile_bytes(m.cols);
  Q16Tile x[kTiles];
  for (int k = 0; k < kTiles; ++k)
    x[k] = q16_tile(m.tiles + size_t(first / kLanes + k) * tile_bytes, m.cols);
  __m512 out[kRows][kTiles];
  tile_rows<kGroup, kMins, kRows, kStride, kTiles>(w, x, m.cols, out);
  store_lanes<kRows, kTiles>(m, out, row, first);
}

// Unpacked rows `row` .. `row + kRows - 1` of `m` against every tile: two at a time, then the
// last one alone.
template <int kGroup, bool kMins, int kRows, int kStride>
void unpacked_against_tiles(const LanesMatmul& m, int64_t row, const UnpackedRow* w) {
  int64_t first = 0;
  for (; first + kLanes < m.n_tokens; first += 2 * kLanes)
    unpacked_against<kGroup, kMins, kRows, kStride, 2>(m, row, w, first);
  if (first < m.n_tokens) unpacked_against<kGroup, kMins, kRows, kStride, 1>(m, row, w, first);
}

template <int kGroup, bool kMins, int kRows>
void rows_against_tiles(const LanesMatmul& m, int64_t row, uint8_t* scratch) {
  const UnpackRowFn unpack = avx512_unpacker(m.type);
  UnpackedRow w[kRows];
  for (int r = 0; r < kRows; ++r) {
    w[r] = unpacked_row(scratch, kRows, m.cols, r);
    unpack(m.weights + size_t(row + r) * m.weight_stride, m.cols, w[r]);
  }
  prefetch_rows(m.weights + size_t(row + kRows) * m.weight_stride, size_t(kRows) * m.weight_stride);
  unpacked_against_tiles<kGroup, kMins, kRows, 1>(m, row, w);
}

// Rows [first_row, last_row) of `m`: sixteen at a time, then four, then one.
template <int kGroup, bool kMins>
void lanes_rows(const LanesMatmul& m, int64_t first_row, int64_t last_row) {
  constexpr int kRows = 4;
  thread_local AlignedBuffer scratch;
  const size_t unpacked_bytes = unpack_scratch_bytes(16, m.cols);
  if (scratch.size() < unpacked_bytes + partial_sums_bytes(m.n_tokens))
    scratch = AlignedBuffer(unpacked_bytes + partial_sums_bytes(m.n_tokens));
  auto* partial = reinterpret_cast<__m512*>(scratch.data() + unpacked_bytes);
  const UnpackRowFn unpack = avx512_unpacker(m.type);
  int64_t row = first_row;
  for (; row + 16 <= last_row; row += 16) {
    UnpackedRow w[16];
    for (int r = 0; r < 16; ++r) {
      w[r] = unpacked_row(scratch.data(), 16, m.cols, r);
      unpack(m.weights + size_t(row + r) * m.weight_stride, m.cols, w[r]);
    }
    prefetch_rows(m.weights + size_t(row + 16) * m.weight_stride, size_t(16) * m.weight_stride);
    sixteen_rows16<kGroup, kMins, 1>(m, w, row, partial);
  }
  for (; row + kRows <= last_row; row += kRows)
    rows_against_tiles<kGroup, kMins, kRows>(m, row, scratch.data());
  for (; row < last_row; ++row) rows_against_tiles<kGroup, kMins, 1>(m, row, scratch.data());
}

// ---- interleaved formats: a group of 16 rows unpacked at once ----
// The widened 32-byte chunks of Q8_0_R16 / Q4_K_R16 (core/blocks.h) are already 16 rows' int16
// pairs side by side, so unpacking is one widening (and for Q4_K a mask or shift) per pair, and
// the scales of 16 rows are one vector. The values and scales are the plain unpackers', so the
// results are bit for bit those of the plain format's rows.

struct UnpackedGroup {
  int16_t* pairs;  // [cols / 2][16 rows][2]
  float* scale;    // [cols / 32][16 rows]
  float* min;      // [cols / 32][16 rows]
};

inline size_t unpacked_group_bytes(int64_t cols) {
  return size_t(cols) * 16 * sizeof(int16_t) + 2 * size_t(cols / 32) * 16 * sizeof(float);
}

inline UnpackedGroup unpacked_group(uint8_t* scratch, int64_t cols) {
  auto* pairs = reinterpret_cast<int16_t*>(scratch);
  auto* scale = reinterpret_cast<float*>(scratch + size_t(cols) * 16 * sizeof(int16_t));
  return {pairs, scale, scale + (cols / 32) * 16};
}

inline __m512 halves_to_float(const uint16_t* p) {
  return _mm512_cvtph_ps(load256(p));
}

inline __m512 bytes_to_float(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

void unpack_group_q8_0(const void* group, int64_t cols, UnpackedGroup out) {
  const auto* blocks = static_cast<const BlockQ8_0_R16*>(group);
  for (int64_t b = 0; b < cols / 32; ++b) {
    _mm512_storeu_ps(out.scale + 16 * b, halves_to_float(blocks[b].d));
    for (int c = 0; c < 16; ++c)
      store512(out.pairs + 32 * (16 * b + c), _mm512_cvtepi8_epi16(load256(blocks[b].qs + 32 * c)));
  }
}

void unpack_group_q4_k(const void* group, int64_t cols, UnpackedGroup out) {
  const auto* blocks = static_cast<const BlockQ4_K_R16*>(group);
  const __m512i low4 = _mm512_set1_epi16(15);
  for (int64_t s = 0; s < cols / kQK_K; ++s) {
    const BlockQ4_K_R16& block = blocks[s];
    const __m512 d = halves_to_float(block.d), dmin = halves_to_float(block.dmin);
    for (int j = 0; j < 8; ++j) {
      const int64_t g = 8 * s + j;
      _mm512_storeu_ps(out.scale + 16 * g, _mm512_mul_ps(d, bytes_to_float(block.scales[j])));
      _mm512_storeu_ps(out.min + 16 * g, _mm512_mul_ps(dmin, bytes_to_float(block.mins[j])));
      for (int c = 0; c < 8; ++c) {
        // Chunk c: pair 2c of the sub-block in the low nibbles, pair 2c + 1 in the high ones.
        const __m512i q = _mm512_cvtepu8_epi16(load256(block.qs[j] + 32 * c));
        store512(out.pairs + 32 * (16 * g + 2 * c), _mm512_and_si512(q, low4));
        store512(out.pairs + 32 * (16 * g + 2 * c + 1), _mm512_srli_epi16(q, 4));
      }
    }
  }
}

void unpack_group_q5_0(const void* group, int64_t cols, UnpackedGroup out) {
  const auto* blocks = static_cast<const BlockQ5_0_R16*>(group);
  const __m512i low4 = _mm512_set1_epi16(15), sixteen = _mm512_set1_epi16(16);
  for (int64_t b = 0; b < cols / 32; ++b) {
    const BlockQ5_0_R16& block = blocks[b];
    _mm512_storeu_ps(out.scale + 16 * b, halves_to_float(block.d));
    for (int c = 0; c < 8; ++c) {
      const __m512i q = _mm512_cvtepu8_epi16(load256(block.qs[c]));
      const __m512i lo = _mm512_sub_epi16(_mm512_and_si512(q, low4), sixteen);
      const __m512i hi = _mm512_sub_epi16(_mm512_srli_epi16(q, 4), sixteen);
      store512(out.pairs + 32 * (16 * b + 2 * c), _mm512_mask_add_epi16(lo, __mmask32(block.qh[c][0]), lo, sixteen));
      store512(out.pairs + 32 * (16 * b + 2 * c + 1), _mm512_mask_add_epi16(hi, __mmask32(block.qh[c][1]), hi, sixteen));
    }
  }
}

using UnpackGroupFn = void (*)(const void* group, int64_t cols, UnpackedGroup out);

// Rows [first_row, last_row) (multiples of 16) of an interleaved matrix: each group unpacked
// once, then against every tile (sixteen_rows16).
template <UnpackGroupFn kUnpack, bool kMins>
void lanes_groups(const LanesMatmul& m, int64_t first_row, int64_t last_row) {
  thread_local AlignedBuffer scratch;
  if (scratch.size() < unpacked_group_bytes(m.cols) + partial_sums_bytes(m.n_tokens))
    scratch = AlignedBuffer(unpacked_group_bytes(m.cols) + partial_sums_bytes(m.n_tokens));
  const UnpackedGroup unpacked = unpacked_group(scratch.data(), m.cols);
  auto* partial = reinterpret_cast<__m512*>(scratch.data() + unpacked_group_bytes(m.cols));
  UnpackedRow w[16];
  for (int r = 0; r < 16; ++r)
    w[r] = {unpacked.pairs + 2 * r, unpacked.scale + r, unpacked.min + r};
  for (int64_t row = first_row; row < last_row; row += 16) {
    kUnpack(m.weights + size_t(row) * m.weight_stride, m.cols, unpacked);
    sixteen_rows16<32, kMins, 16>(m, w, row, partial);
  }
}

LanesRowsFn lanes_kernel_for(UnpackShape shape) {
  if (shape.group == 16) return shape.mins ? nullptr : lanes_rows<16, false>;
  return shape.mins ? lanes_rows<32, true> : lanes_rows<32, false>;
}

}  // namespace

void fill_avx512_lanes_kernels(KernelTable& table) {
  for (DType type : kLanesFormats)
    table.lanes[size_t(type)] = lanes_kernel_for(row_unpacker(type).shape);
  table.group_lanes[size_t(DType::Q8_0)] = lanes_groups<unpack_group_q8_0, false>;
  table.group_lanes[size_t(DType::Q5_0)] = lanes_groups<unpack_group_q5_0, false>;
  table.group_lanes[size_t(DType::Q4_K)] = lanes_groups<unpack_group_q4_k, true>;
}

}  // namespace tandem::cpu

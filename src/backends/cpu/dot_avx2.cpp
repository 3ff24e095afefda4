// AVX2 + FMA + F16C kernels. Integer formats: maddubs (u8 x s8 -> s16 pairs) then madd with the
// sub-block scales (s16 x s16 -> s32). The pair sums never saturate: weights are at most 6 bits
// unsigned (63 * 127 * 2 < 32767), and Q8_0 goes through |w| x sign(x, w) (128 * 127 * 2 <
// 32767) because activations are in [-127, 127].
#include "backends/cpu/avx2_intrinsics.h"

#include <cstring>

#include "backends/cpu/kernels.h"
#include "backends/cpu/kscales.h"
#include "core/dtype.h"

namespace tandem::cpu {
namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline int32_t hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

inline float f16(uint16_t h) {
  return _cvtsh_ss(h);
}

inline __m256i load256(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}
inline __m128i load128(const void* p) {
  return _mm_loadu_si128(static_cast<const __m128i*>(p));
}

// Σ u*s over groups of 4 bytes, as 8 int32.
inline __m256i dot_u8_s8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// 32 nibbles of 16 bytes: element j in the low nibble of byte j, element j+16 in the high one.
inline __m256i unpack_nibbles_32(const uint8_t* qs) {
  const __m128i v = load128(qs);
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(15));
}

// ---- float formats: x in place ----

float dot_f32(const void* w, const void* a, int64_t cols) {
  const auto* wr = static_cast<const float*>(w);
  const auto* x = static_cast<const float*>(a);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= cols; i += 32) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + i), _mm256_loadu_ps(x + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + i + 8), _mm256_loadu_ps(x + i + 8), acc1);
    acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + i + 16), _mm256_loadu_ps(x + i + 16), acc2);
    acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + i + 24), _mm256_loadu_ps(x + i + 24), acc3);
  }
  for (; i + 8 <= cols; i += 8)
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + i), _mm256_loadu_ps(x + i), acc0);
  float sum = hsum(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
  for (; i < cols; ++i) sum += wr[i] * x[i];
  return sum;
}

// F16 and BF16: `widen` turns 8 halves into 8 floats, `to_f32` one (for the tail).
template <class Widen, class ToF32>
inline float dot_half(const void* w, const void* a, int64_t cols, Widen widen, ToF32 to_f32) {
  const auto* wr = static_cast<const uint16_t*>(w);
  const auto* x = static_cast<const float*>(a);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= cols; i += 32) {
    acc0 = _mm256_fmadd_ps(widen(load128(wr + i)), _mm256_loadu_ps(x + i), acc0);
    acc1 = _mm256_fmadd_ps(widen(load128(wr + i + 8)), _mm256_loadu_ps(x + i + 8), acc1);
    acc2 = _mm256_fmadd_ps(widen(load128(wr + i + 16)), _mm256_loadu_ps(x + i + 16), acc2);
    acc3 = _mm256_fmadd_ps(widen(load128(wr + i + 24)), _mm256_loadu_ps(x + i + 24), acc3);
  }
  for (; i + 8 <= cols; i += 8)
    acc0 = _mm256_fmadd_ps(widen(load128(wr + i)), _mm256_loadu_ps(x + i), acc0);
  float sum = hsum(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
  for (; i < cols; ++i) sum += to_f32(wr[i]) * x[i];
  return sum;
}

float dot_f16(const void* w, const void* a, int64_t cols) {
  return dot_half(
      w, a, cols, [](__m128i h) { return _mm256_cvtph_ps(h); }, f16);
}

float dot_bf16(const void* w, const void* a, int64_t cols) {
  // bf16 is the top half of an f32: widening is a shift.
  return dot_half(
      w, a, cols,
      [](__m128i h) {
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
      },
      [](uint16_t h) {
        const uint32_t bits = uint32_t(h) << 16;
        float f;
        std::memcpy(&f, &bits, sizeof(f));
        return f;
      });
}

// ---- 32-element formats against ActBlockQ8 ----
// Per block: 8 int32 partial sums, converted once and scaled by d_w * d_x into a float vector.
// Offsets (Q4_0's -8, Q5_0's -16) are subtracted in the integer lanes: -8 * Σx spread over 8
// lanes is -Σx per lane.

// Σ over blocks of block(b, acc), alternating two accumulators so consecutive blocks' FMAs do not
// wait on each other.
template <class BlockFn>
inline float sum_blocks(int64_t n_blocks, BlockFn block) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 2 <= n_blocks; b += 2) {
    acc0 = block(b, acc0);
    acc1 = block(b + 1, acc1);
  }
  if (b < n_blocks) acc0 = block(b, acc0);
  return hsum(_mm256_add_ps(acc0, acc1));
}

inline __m256 block_product(__m256i dot, float scale, __m256 acc) {
  return _mm256_fmadd_ps(_mm256_set1_ps(scale), _mm256_cvtepi32_ps(dot), acc);
}

float dot_q8_0(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockQ8_0*>(w);
  const auto* xb = static_cast<const ActBlockQ8*>(a);
  return sum_blocks(cols / 32, [&](int64_t b, __m256 acc) {
    const __m256i q = load256(wb[b].qs);
    const __m256i dot = dot_u8_s8(_mm256_abs_epi8(q), _mm256_sign_epi8(load256(xb[b].qs), q));
    return block_product(dot, f16(wb[b].d) * xb[b].d, acc);
  });
}

float dot_q4_0(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockQ4_0*>(w);
  const auto* xb = static_cast<const ActBlockQ8*>(a);
  return sum_blocks(cols / 32, [&](int64_t b, __m256 acc) {
    const __m256i dot = dot_u8_s8(unpack_nibbles_32(wb[b].qs), load256(xb[b].qs));
    return block_product(_mm256_sub_epi32(dot, _mm256_set1_epi32(xb[b].sum)),
                         f16(wb[b].d) * xb[b].d, acc);
  });
}

float dot_q5_0(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockQ5_0*>(w);
  const auto* xb = static_cast<const ActBlockQ8*>(a);
  return sum_blocks(cols / 32, [&](int64_t b, __m256 acc) {
    uint32_t qh;
    std::memcpy(&qh, wb[b].qh, sizeof(qh));
    const __m256i high = _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(16));
    const __m256i q = _mm256_or_si256(unpack_nibbles_32(wb[b].qs), high);
    const __m256i dot = dot_u8_s8(q, load256(xb[b].qs));
    return block_product(_mm256_sub_epi32(dot, _mm256_set1_epi32(2 * xb[b].sum)),
                         f16(wb[b].d) * xb[b].d, acc);
  });
}

// ---- k-quants against BlockQ8_K ----
// Per super-block: int32 lanes accumulate Σ scale_j * Σ q x over all sub-blocks; the mins
// (Q4_K, Q5_K) or the -32 offset (Q6_K) come from the activation sums per 16 (bsums).

// Scales and mins of a Q4_K / Q5_K super-block as int16 vectors: `scales` holds the 8 scales in
// both 128-bit lanes (for in-lane broadcasts), `mins` each min twice, matching bsums per 16.
struct KScaleVectors {
  __m256i scales;
  __m256i mins;
};

inline KScaleVectors k_scale_vectors(const uint8_t packed[kKScaleBytes]) {
  alignas(16) uint32_t words[4];
  unpack_k_scales_words(packed, words);
  const __m128i bytes = _mm_load_si128(reinterpret_cast<const __m128i*>(words));
  return {_mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(bytes)),
          _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(bytes, bytes))};
}

// Scale of sub-block k in every int16 lane.
inline __m256i broadcast_scale(__m256i scales, int k) {
  return _mm256_shuffle_epi8(scales, _mm256_set1_epi16(short((2 * k + 1) << 8 | 2 * k)));
}

float dot_q4_k(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockQ4_K*>(w);
  const auto* xb = static_cast<const BlockQ8_K*>(a);
  const __m256i low4 = _mm256_set1_epi8(15);
  __m256 acc = _mm256_setzero_ps();
  __m256 mins_acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const BlockQ4_K& block = wb[b];
    const KScaleVectors s = k_scale_vectors(block.scales);
    const int8_t* x = xb[b].qs;
    __m256i dot = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      const __m256i q = load256(block.qs + 32 * c);
      const __m256i lo = _mm256_and_si256(q, low4);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
      const __m256i p_lo = _mm256_maddubs_epi16(lo, load256(x + 64 * c));
      const __m256i p_hi = _mm256_maddubs_epi16(hi, load256(x + 64 * c + 32));
      dot = _mm256_add_epi32(dot, _mm256_madd_epi16(p_lo, broadcast_scale(s.scales, 2 * c)));
      dot = _mm256_add_epi32(dot, _mm256_madd_epi16(p_hi, broadcast_scale(s.scales, 2 * c + 1)));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(xb[b].d * f16(block.d)), _mm256_cvtepi32_ps(dot), acc);
    const __m256i mins = _mm256_madd_epi16(s.mins, load256(xb[b].bsums));
    mins_acc = _mm256_fmadd_ps(_mm256_set1_ps(xb[b].d * f16(block.dmin)), _mm256_cvtepi32_ps(mins),
                               mins_acc);
  }
  return hsum(_mm256_sub_ps(acc, mins_acc));
}

float dot_q5_k(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockQ5_K*>(w);
  const auto* xb = static_cast<const BlockQ8_K*>(a);
  const __m256i low4 = _mm256_set1_epi8(15);
  const __m256i one = _mm256_set1_epi8(1);
  __m256 acc = _mm256_setzero_ps();
  __m256 mins_acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const BlockQ5_K& block = wb[b];
    const KScaleVectors s = k_scale_vectors(block.scales);
    const int8_t* x = xb[b].qs;
    // Bit j of qh[i] is the fifth bit of element i of sub-block j; shifted down 2 per chunk.
    __m256i qh = load256(block.qh);
    __m256i dot = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      const __m256i q = load256(block.qs + 32 * c);
      const __m256i h_lo = _mm256_slli_epi16(_mm256_and_si256(qh, one), 4);
      const __m256i h_hi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 1), one), 4);
      qh = _mm256_srli_epi16(qh, 2);
      const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, low4), h_lo);
      const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), low4), h_hi);
      const __m256i p_lo = _mm256_maddubs_epi16(lo, load256(x + 64 * c));
      const __m256i p_hi = _mm256_maddubs_epi16(hi, load256(x + 64 * c + 32));
      dot = _mm256_add_epi32(dot, _mm256_madd_epi16(p_lo, broadcast_scale(s.scales, 2 * c)));
      dot = _mm256_add_epi32(dot, _mm256_madd_epi16(p_hi, broadcast_scale(s.scales, 2 * c + 1)));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(xb[b].d * f16(block.d)), _mm256_cvtepi32_ps(dot), acc);
    const __m256i mins = _mm256_madd_epi16(s.mins, load256(xb[b].bsums));
    mins_acc = _mm256_fmadd_ps(_mm256_set1_ps(xb[b].d * f16(block.dmin)), _mm256_cvtepi32_ps(mins),
                               mins_acc);
  }
  return hsum(_mm256_sub_ps(acc, mins_acc));
}

// [scales[k] x 8, scales[k+1] x 8] as int16, from the 16 int8 scales of a Q6_K block.
inline __m256i q6_scale_pair(__m128i scales8, int k) {
  const __m128i index = _mm_add_epi8(_mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                     _mm_set1_epi8(char(k)));
  return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales8, index));
}

float dot_q6_k(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockQ6_K*>(w);
  const auto* xb = static_cast<const BlockQ8_K*>(a);
  const __m256i low4 = _mm256_set1_epi8(15);
  const __m256i low2 = _mm256_set1_epi8(3);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const BlockQ6_K& block = wb[b];
    const __m128i scales8 = load128(block.scales);
    // The -32 offset: Σ_k scale_k * bsums_k, taken out of the integer sum at the end.
    const __m256i offsets = _mm256_madd_epi16(_mm256_cvtepi8_epi16(scales8), load256(xb[b].bsums));
    __m256i dot = _mm256_setzero_si256();
    for (int half = 0; half < 2; ++half) {
      const __m256i ql0 = load256(block.ql + 64 * half);
      const __m256i ql1 = load256(block.ql + 64 * half + 32);
      const __m256i qh = load256(block.qh + 32 * half);
      const int8_t* x = xb[b].qs + 128 * half;
      const __m256i q[4] = {
          _mm256_or_si256(_mm256_and_si256(ql0, low4),
                          _mm256_slli_epi16(_mm256_and_si256(qh, low2), 4)),
          _mm256_or_si256(_mm256_and_si256(ql1, low4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), low2), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), low2), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), low2), 4)),
      };
      for (int p = 0; p < 4; ++p) {
        const __m256i prod = _mm256_maddubs_epi16(q[p], load256(x + 32 * p));
        dot = _mm256_add_epi32(dot,
                               _mm256_madd_epi16(prod, q6_scale_pair(scales8, 8 * half + 2 * p)));
      }
    }
    dot = _mm256_sub_epi32(dot, _mm256_slli_epi32(offsets, 5));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(xb[b].d * f16(block.d)), _mm256_cvtepi32_ps(dot), acc);
  }
  return hsum(acc);
}

// ---- activation preparation ----
// Bit for bit the portable quantizer: the same amax, the same 127 / amax and product, and
// cvtps2dq rounds to nearest even exactly as the portable rounding trick does for |v| <= 127.

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// max |x| over n (a multiple of 8) values.
inline float abs_max(const float* x, int n) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 m = _mm256_setzero_ps();
  for (int i = 0; i < n; i += 8)
    m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
  return hmax(m);
}

// Quantizes 32 values with `inverse_scale`, stores 32 int8 and returns them as 4 x 8 int32.
struct Quantized32 {
  __m256i q[4];
};
inline Quantized32 quantize_32(const float* x, __m256 inverse_scale, int8_t* out) {
  Quantized32 r;
  for (int i = 0; i < 4; ++i)
    r.q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * i), inverse_scale));
  // packs interleave 128-bit lanes; the permute puts the 4-byte groups back in order.
  const __m256i bytes =
      _mm256_packs_epi16(_mm256_packs_epi32(r.q[0], r.q[1]), _mm256_packs_epi32(r.q[2], r.q[3]));
  _mm256_storeu_si256(
      reinterpret_cast<__m256i*>(out),
      _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  return r;
}

void prepare_q8(const float* x, void* act_row, int64_t cols) {
  auto* blocks = static_cast<ActBlockQ8*>(act_row);
  for (int64_t b = 0; b < cols / 32; ++b) {
    const float amax = abs_max(x + 32 * b, 32);
    const float inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
    const Quantized32 r = quantize_32(x + 32 * b, _mm256_set1_ps(inverse), blocks[b].qs);
    blocks[b].d = amax / 127.0f;
    blocks[b].sum = hsum_i32(
        _mm256_add_epi32(_mm256_add_epi32(r.q[0], r.q[1]), _mm256_add_epi32(r.q[2], r.q[3])));
  }
}

void prepare_q8_k(const float* x, void* act_row, int64_t cols) {
  auto* blocks = static_cast<BlockQ8_K*>(act_row);
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const float* xb = x + kQK_K * b;
    const float amax = abs_max(xb, kQK_K);
    const __m256 inverse = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    blocks[b].d = amax / 127.0f;
    for (int g = 0; g < kQK_K / 32; ++g) {
      const Quantized32 r = quantize_32(xb + 32 * g, inverse, blocks[b].qs + 32 * g);
      blocks[b].bsums[2 * g] = int16_t(hsum_i32(_mm256_add_epi32(r.q[0], r.q[1])));
      blocks[b].bsums[2 * g + 1] = int16_t(hsum_i32(_mm256_add_epi32(r.q[2], r.q[3])));
    }
  }
}

// The grid i-quants against BlockQ8_K, per chunk of 32: unsigned weights against the quants
// through maddubs (pairs below 2 * 62 * 127 < 32767). IQ2 / IQ3: the grid values, the weights'
// signs moved onto the quants. IQ1: 8 * grid +- 1 + 16 = 8 * (grid + 2) +- 1 (7 .. 25), less
// 16 * Σ x afterwards (the Q8_K sums of 16). A group of 16 is lanes 0-3 or 4-7.
template <class Block>
float dot_iq_grid_q8(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const Block*>(w);
  const auto* xb = static_cast<const BlockQ8_K*>(a);
  float scale[kQK_K / 16];
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    iq_scales(wb[b], scale);
    for (int k = 0; k < 8; ++k) {
      const IqChunk chunk = iq_chunk(wb[b], k);
      const __m256i m = bits_to_bytes(chunk.flip);
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb[b].qs + 32 * k));
      __m256i dot;
      if constexpr (kIqShifted<Block>) {
        const __m256i eights = _mm256_slli_epi16(_mm256_add_epi8(iq_chunk_points(chunk), _mm256_set1_epi8(2)), 3);
        const __m256i u = _mm256_add_epi8(eights, _mm256_or_si256(m, _mm256_set1_epi8(1)));
        const __m256i offsets = _mm256_setr_epi32(16 * xb[b].bsums[2 * k], 0, 0, 0, 16 * xb[b].bsums[2 * k + 1], 0, 0, 0);
        dot = _mm256_sub_epi32(dot_u8_s8(u, x), offsets);
      } else {
        dot = dot_u8_s8(iq_chunk_points(chunk), _mm256_sub_epi8(_mm256_xor_si256(x, m), m));
      }
      const __m256 chunk_scale = kIqGroup<Block> == 32
                                     ? _mm256_set1_ps(scale[k] * xb[b].d)
                                     : _mm256_setr_m128(_mm_set1_ps(scale[2 * k] * xb[b].d),
                                                        _mm_set1_ps(scale[2 * k + 1] * xb[b].d));
      acc[k & 1] = _mm256_fmadd_ps(chunk_scale, _mm256_cvtepi32_ps(dot), acc[k & 1]);
    }
  }
  return hsum(_mm256_add_ps(acc[0], acc[1]));
}

}  // namespace

void fill_avx2_kernels(KernelTable& table) {
  // Float formats serve both precisions; the 8-bit kernels only Int8.
  auto set = [&](DType type, ActKind act, RowDotFn dot) {
    table.formats[size_t(ActPrecision::Int8)][size_t(type)] = {act, dot};
    if (act == ActKind::F32) table.formats[size_t(ActPrecision::Int16)][size_t(type)] = {act, dot};
  };
  set(DType::F32, ActKind::F32, dot_f32);
  set(DType::F16, ActKind::F32, dot_f16);
  set(DType::BF16, ActKind::F32, dot_bf16);
  set(DType::Q8_0, ActKind::Q8, dot_q8_0);
  set(DType::Q4_0, ActKind::Q8, dot_q4_0);
  set(DType::Q5_0, ActKind::Q8, dot_q5_0);
  set(DType::Q4_K, ActKind::Q8_K, dot_q4_k);
  set(DType::Q5_K, ActKind::Q8_K, dot_q5_k);
  set(DType::Q6_K, ActKind::Q8_K, dot_q6_k);
  for (DType type : kIqGridFormats)
    visit_iq_grid(type, [&](auto f) { set(type, ActKind::Q8_K, dot_iq_grid_q8<typename decltype(f)::Block>); });
  table.prepare[size_t(ActKind::Q8)] = prepare_q8;
  table.prepare[size_t(ActKind::Q8_K)] = prepare_q8_k;
}

}  // namespace tandem::cpu

// AVX2 Int16-precision kernels: Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4,
// TQ1_0, TQ2_0 and the grid i-quants against ActKind::Q16 (act_q16.h), and the Q16 preparation.
// Other formats use the portable kernels.
//
// One 32-element activation block is two ymm of int16. Weights are built as bytes (with their
// offsets applied: Q4_0 -8, Q5_0 -16, Q6_K -32, so every weight is signed and |w| <= 128),
// widened to int16, and vpmaddwd gives int32 pair sums of at most 2 * 128 * 32767 = 8.4e6; two of
// them per lane per block stay far below 2^31. (The one pair that overflows vpmaddwd,
// (-32768)^2 * 2, never occurs: |q| <= 32767.) Each block (or 16-element sub-block of Q6_K) is
// converted to float once and scaled in one FMA; the sum over blocks is in float.
#include "backends/cpu/avx2_intrinsics.h"

#include <cstring>

#include "backends/cpu/act_q16.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/kscales.h"
#include "core/blocks.h"
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

// Makes the compiler forget what it stored at `p`, so that the FMAs read each scale stored there
// with a broadcast load (a load-port operation) where GCC would otherwise extract and broadcast
// it within registers (two vector ALU operations per block, in loops bound by them).
inline void reload_from_memory(const void* p) {
  asm volatile("" : : "r"(p) : "memory");
}

inline __m256i load256(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}
inline __m128i load128(const void* p) {
  return _mm_loadu_si128(static_cast<const __m128i*>(p));
}
// 16 activations (int16) starting at element i; the row is 64-byte aligned, i a multiple of 16.
inline __m256i load_x(const Q16Row& x, int64_t i) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + i));
}

// Σ w x over 32 elements given as 32 signed bytes in element order, as 8 int32.
inline __m256i dot_bytes_32(__m256i w, const Q16Row& x, int64_t i) {
  const __m256i lo =
      _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(w)), load_x(x, i));
  const __m256i hi =
      _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(w, 1)), load_x(x, i + 16));
  return _mm256_add_epi32(lo, hi);
}

// 32 nibbles of 16 bytes as bytes: element j in the low nibble of byte j, j+16 in the high one.
inline __m256i unpack_nibbles_32(const uint8_t* qs) {
  const __m128i v = load128(qs);
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(15));
}

// ---- 32-element formats ----

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
  const Q16Row x = q16_row(a, cols);
  return sum_blocks(cols / 32, [&](int64_t b, __m256 acc) {
    return block_product(dot_bytes_32(load256(wb[b].qs), x, 32 * b), f16(wb[b].d) * x.d[b], acc);
  });
}

float dot_q4_0(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockQ4_0*>(w);
  const Q16Row x = q16_row(a, cols);
  return sum_blocks(cols / 32, [&](int64_t b, __m256 acc) {
    // Widened first: the high nibble is then a shift, the low one a mask.
    const __m256i q = _mm256_cvtepu8_epi16(load128(wb[b].qs));
    const __m256i eight = _mm256_set1_epi16(8);
    const __m256i lo = _mm256_sub_epi16(_mm256_and_si256(q, _mm256_set1_epi16(15)), eight);
    const __m256i hi = _mm256_sub_epi16(_mm256_srli_epi16(q, 4), eight);
    const __m256i dot = _mm256_add_epi32(_mm256_madd_epi16(lo, load_x(x, 32 * b)),
                                         _mm256_madd_epi16(hi, load_x(x, 32 * b + 16)));
    return block_product(dot, f16(wb[b].d) * x.d[b], acc);
  });
}

float dot_q5_0(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockQ5_0*>(w);
  const Q16Row x = q16_row(a, cols);
  return sum_blocks(cols / 32, [&](int64_t b, __m256 acc) {
    uint32_t qh;
    std::memcpy(&qh, wb[b].qh, sizeof(qh));
    // q - 16 = nibble - 16 where the fifth bit is clear, the nibble where it is set.
    const __m256i minus = _mm256_andnot_si256(bits_to_bytes(qh), _mm256_set1_epi8(16));
    const __m256i q = _mm256_sub_epi8(unpack_nibbles_32(wb[b].qs), minus);
    return block_product(dot_bytes_32(q, x, 32 * b), f16(wb[b].d) * x.d[b], acc);
  });
}

// ---- k-quants ----

// Q4_K and Q5_K: sub-block j (32 elements) is activation block 8b + j, with one float scale
// d * scale_j * dx_j (made 8 at a time); the mins go through the activation sums per 16.
template <bool kFifthBit, class Block>
inline float dot_q4_q5_k(const Block* wb, const void* a, int64_t cols) {
  const Q16Row x = q16_row(a, cols);
  const __m256i low4 = _mm256_set1_epi8(15);
  const __m256i one = _mm256_set1_epi8(1);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  __m256 mins_acc = _mm256_setzero_ps();
  alignas(32) float scale[8];
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const Block& block = wb[b];
    alignas(16) uint32_t words[4];  // bytes 0..7: scales, 8..15: mins
    unpack_k_scales_words(block.scales, words);
    const __m128i bytes = _mm_load_si128(reinterpret_cast<const __m128i*>(words));
    const __m256 sub_scales = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
    _mm256_store_ps(scale, _mm256_mul_ps(_mm256_mul_ps(sub_scales, _mm256_set1_ps(f16(block.d))),
                                         _mm256_loadu_ps(x.d + 8 * b)));
    reload_from_memory(scale);
    // Σ_k min_{k/2} * sum16_k: each min twice against the 16 sums of the super-block.
    const __m128i mins2 = _mm_unpackhi_epi8(bytes, bytes);
    const __m256 dmin = _mm256_set1_ps(f16(block.dmin));
    const __m256 mins_lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mins2));
    const __m256 mins_hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(mins2, 8)));
    mins_acc =
        _mm256_fmadd_ps(_mm256_mul_ps(mins_lo, dmin), _mm256_loadu_ps(x.sum16 + 16 * b), mins_acc);
    mins_acc = _mm256_fmadd_ps(_mm256_mul_ps(mins_hi, dmin), _mm256_loadu_ps(x.sum16 + 16 * b + 8),
                               mins_acc);
    __m256i qh = _mm256_setzero_si256();
    if constexpr (kFifthBit) qh = load256(block.qh);
    for (int c = 0; c < 4; ++c) {
      const __m256i q = load256(block.qs + 32 * c);
      __m256i lo = _mm256_and_si256(q, low4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
      if constexpr (kFifthBit) {
        // Bit 2c of qh[i] is the fifth bit of sub-block 2c, bit 2c + 1 of 2c + 1.
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(qh, one), 4));
        hi = _mm256_or_si256(hi,
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 1), one), 4));
        qh = _mm256_srli_epi16(qh, 2);
      }
      const int64_t i = kQK_K * b + 64 * c;
      acc[(2 * c) % 4] = block_product(dot_bytes_32(lo, x, i), scale[2 * c], acc[(2 * c) % 4]);
      acc[(2 * c + 1) % 4] =
          block_product(dot_bytes_32(hi, x, i + 32), scale[2 * c + 1], acc[(2 * c + 1) % 4]);
    }
  }
  const __m256 total = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
  return hsum(_mm256_sub_ps(total, mins_acc));
}

float dot_q4_k(const void* w, const void* a, int64_t cols) {
  return dot_q4_q5_k<false>(static_cast<const BlockQ4_K*>(w), a, cols);
}

float dot_q5_k(const void* w, const void* a, int64_t cols) {
  return dot_q4_q5_k<true>(static_cast<const BlockQ5_K*>(w), a, cols);
}

// Q6_K: one ymm of 16 int16 weights is exactly one 16-element sub-block, so each madd result is
// scaled by its own sub-block scale x d x dx (16 made per super-block).
float dot_q6_k(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockQ6_K*>(w);
  const Q16Row x = q16_row(a, cols);
  const __m256i low4 = _mm256_set1_epi8(15);
  const __m256i low2 = _mm256_set1_epi8(3);
  const __m256i offset = _mm256_set1_epi8(32);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  alignas(32) float scale[16];
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const BlockQ6_K& block = wb[b];
    const __m128i scales8 = load128(block.scales);
    const __m256 d = _mm256_set1_ps(f16(block.d));
    const __m256 dx = _mm256_loadu_ps(x.d + 8 * b);
    // Sub-block k uses activation block k / 2.
    const __m256 dx_lo = _mm256_permutevar8x32_ps(dx, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
    const __m256 dx_hi = _mm256_permutevar8x32_ps(dx, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7));
    const __m256 s_lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(scales8));
    const __m256 s_hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(scales8, 8)));
    _mm256_store_ps(scale, _mm256_mul_ps(_mm256_mul_ps(s_lo, dx_lo), d));
    _mm256_store_ps(scale + 8, _mm256_mul_ps(_mm256_mul_ps(s_hi, dx_hi), d));
    reload_from_memory(scale);
    for (int half = 0; half < 2; ++half) {
      const __m256i ql0 = load256(block.ql + 64 * half);
      const __m256i ql1 = load256(block.ql + 64 * half + 32);
      const __m256i qh = load256(block.qh + 32 * half);
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
        const __m256i w8 = _mm256_sub_epi8(q[p], offset);  // q - 32 in -32..31
        const int64_t i = kQK_K * b + 128 * half + 32 * p;
        const int k = 8 * half + 2 * p;
        const __m256i dot0 =
            _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(w8)), load_x(x, i));
        const __m256i dot1 = _mm256_madd_epi16(
            _mm256_cvtepi8_epi16(_mm256_extracti128_si256(w8, 1)), load_x(x, i + 16));
        acc[p] = block_product(dot0, scale[k], acc[p]);
        acc[p] = block_product(dot1, scale[k + 1], acc[p]);
      }
    }
  }
  return hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
}

// ---- activation preparation ----
// Bit for bit the portable preparer: the same amax, the same 32767 / amax and product, cvtps2dq
// rounding to nearest even as the portable trick does, and exact int32 sums before d * Σq.

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

void prepare_q16(const float* x, void* act_row, int64_t cols) {
  const Q16RowOut row = q16_row_out(act_row, cols);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < cols / 32; ++b) {
    __m256 v[4];
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(x + 32 * b + 8 * i);
      m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
    }
    const float amax = hmax(m);
    const __m256 inverse = _mm256_set1_ps(amax > 0.0f ? kQ16Max / amax : 0.0f);
    const float d = amax / kQ16Max;
    __m256i q[4];
    for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inverse));
    // packs (exact: |q| <= 32767) interleaves 128-bit lanes; the permute restores the order.
    for (int h = 0; h < 2; ++h) {
      const __m256i packed =
          _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2 * h], q[2 * h + 1]), 0xd8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(row.q + 32 * b + 16 * h), packed);
      row.sum16[2 * b + h] = d * float(hsum_i32(_mm256_add_epi32(q[2 * h], q[2 * h + 1])));
    }
    row.d[b] = d;
  }
}

// ---- Q4_1, and the formats whose 4-bit codes index 16 levels (IQ4_NL, IQ4_XS, MXFP4) ----

// Q4_1: d · q + m; the m part from the activations' two sums per 16 of the block.
float dot_q4_1(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockQ4_1*>(w);
  const Q16Row x = q16_row(a, cols);
  float m_sum = 0.0f;
  const float sum = sum_blocks(cols / 32, [&](int64_t b, __m256 acc) {
    m_sum += f16(wb[b].m) * (x.sum16[2 * b] + x.sum16[2 * b + 1]);
    return block_product(dot_bytes_32(unpack_nibbles_32(wb[b].qs), x, 32 * b),
                         f16(wb[b].d) * x.d[b], acc);
  });
  return sum + m_sum;
}

// A 16-entry table of signed levels in both 128-bit lanes, for vpshufb.
inline __m256i level_table(const int8_t* levels) {
  return _mm256_broadcastsi128_si256(load128(levels));
}

// 32 codes of 16 bytes (as Q4_0's nibbles) looked up as signed levels.
inline __m256i levels_32(const uint8_t* qs, __m256i table) {
  return _mm256_shuffle_epi8(table, unpack_nibbles_32(qs));
}

float dot_iq4_nl(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockIQ4_NL*>(w);
  const Q16Row x = q16_row(a, cols);
  const __m256i table = level_table(kIq4NlValues);
  return sum_blocks(cols / 32, [&](int64_t b, __m256 acc) {
    return block_product(dot_bytes_32(levels_32(wb[b].qs, table), x, 32 * b),
                         f16(wb[b].d) * x.d[b], acc);
  });
}

float dot_mxfp4(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockMXFP4*>(w);
  const Q16Row x = q16_row(a, cols);
  const __m256i table = level_table(kE2M1Doubled.v);
  return sum_blocks(cols / 32, [&](int64_t b, __m256 acc) {
    return block_product(dot_bytes_32(levels_32(wb[b].qs, table), x, 32 * b),
                         mxfp4_scale(wb[b].e) * x.d[b], acc);
  });
}

float dot_iq4_xs(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockIQ4_XS*>(w);
  const Q16Row x = q16_row(a, cols);
  const __m256i table = level_table(kIq4NlValues);
  return sum_blocks(cols / 32, [&](int64_t g, __m256 acc) {
    const BlockIQ4_XS& block = wb[g / 8];
    const int sub = int(g % 8);
    const float scale = f16(block.d) * float(iq4_xs_sub_scale(block, sub)) * x.d[g];
    return block_product(dot_bytes_32(levels_32(block.qs + 16 * sub, table), x, 32 * g), scale,
                         acc);
  });
}

// ---- the ternary formats: x = d · (q - 1), one d per 256 elements ----

// TQ2_0: group k of a half is bits 2k, 2k + 1 of its 32 bytes.
float dot_tq2_0(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockTQ2_0*>(w);
  const Q16Row x = q16_row(a, cols);
  return sum_blocks(cols / 32, [&](int64_t g, __m256 acc) {
    const BlockTQ2_0& block = wb[g / 8];
    const int k = int(g % 8);
    const __m256i bytes = load256(block.qs + 32 * (k / 4));
    const __m256i q = _mm256_and_si256(_mm256_srl_epi16(bytes, _mm_cvtsi32_si128(2 * (k % 4))),
                                       _mm256_set1_epi8(3));
    return block_product(dot_bytes_32(_mm256_sub_epi8(q, _mm256_set1_epi8(1)), x, 32 * g),
                         f16(block.d) * x.d[g], acc);
  });
}

// TQ1_0: digit n of byte b is ((b · 3^n) mod 256) · 3 >> 8 (core/blocks.h), on 16-bit lanes: a
// multiply, a mask, and the high half of a multiply by 3 · 256, 16 weights at a time. Group g's
// first and second 16 weights: groups 0-4 digit g of qs[0..15] and qs[16..31]; 5 and 6 digits
// 0, 1 and 2, 3 of qs[32..47]; 7 digit 4 of qs[32..47], then digit n of qh[m] for element
// 240 + 4 n + m.
float dot_tq1_0(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockTQ1_0*>(w);
  const Q16Row x = q16_row(a, cols);
  auto digits = [](__m128i bytes, __m256i pow3) {
    const __m256i low = _mm256_and_si256(_mm256_mullo_epi16(_mm256_cvtepu8_epi16(bytes), pow3),
                                         _mm256_set1_epi16(255));
    return _mm256_sub_epi16(_mm256_mulhi_epu16(low, _mm256_set1_epi16(3 * 256)),
                            _mm256_set1_epi16(1));
  };
  constexpr int16_t kPow3[5] = {1, 3, 9, 27, 81};
  const __m256i qh_pow3 = _mm256_setr_epi16(1, 1, 1, 1, 3, 3, 3, 3, 9, 9, 9, 9, 27, 27, 27, 27);
  return sum_blocks(cols / 32, [&](int64_t g, __m256 acc) {
    const BlockTQ1_0& block = wb[g / 8];
    const int k = int(g % 8);
    __m256i first, second;
    if (k < 5) {
      const __m256i pow3 = _mm256_set1_epi16(kPow3[k]);
      first = digits(load128(block.qs), pow3);
      second = digits(load128(block.qs + 16), pow3);
    } else if (k < 7) {
      const __m128i bytes = load128(block.qs + 32);
      first = digits(bytes, _mm256_set1_epi16(kPow3[2 * (k - 5)]));
      second = digits(bytes, _mm256_set1_epi16(kPow3[2 * (k - 5) + 1]));
    } else {
      uint32_t qh;
      std::memcpy(&qh, block.qh, sizeof(qh));
      first = digits(load128(block.qs + 32), _mm256_set1_epi16(kPow3[4]));
      second = digits(_mm_set1_epi32(int32_t(qh)), qh_pow3);
    }
    const __m256i dot = _mm256_add_epi32(_mm256_madd_epi16(first, load_x(x, 32 * g)),
                                         _mm256_madd_epi16(second, load_x(x, 32 * g + 16)));
    return block_product(dot, f16(block.d) * x.d[g], acc);
  });
}

// ---- the grid i-quants (core/iq_blocks.h) ----

// Per chunk (avx2_intrinsics.h builds its bytes) of 32: one scale (groups of 32), or one per half (groups of 16).
template <class Block>
float dot_iq_grid(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const Block*>(w);
  const Q16Row x = q16_row(a, cols);
  float scale[kQK_K / 16];
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    iq_scales(wb[b], scale);
    for (int k = 0; k < 8; ++k) {
      const __m256i bytes = iq_chunk_bytes<Block>(iq_chunk(wb[b], k));
      const int64_t i = kQK_K * b + 32 * k;
      const float dx = x.d[8 * b + k];
      if constexpr (kIqGroup<Block> == 32) {
        acc[k & 1] = block_product(dot_bytes_32(bytes, x, i), scale[k] * dx, acc[k & 1]);
      } else {
        const __m256i lo = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(bytes)), load_x(x, i));
        const __m256i hi =
            _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(bytes, 1)), load_x(x, i + 16));
        acc[0] = block_product(lo, scale[2 * k] * dx, acc[0]);
        acc[1] = block_product(hi, scale[2 * k + 1] * dx, acc[1]);
      }
    }
  }
  return hsum(_mm256_add_ps(acc[0], acc[1]));
}

}  // namespace

void fill_avx2_q16_kernels(KernelTable& table) {
  auto set = [&](DType type, RowDotFn dot) {
    table.formats[size_t(ActPrecision::Int16)][size_t(type)] = {ActKind::Q16, dot};
  };
  set(DType::Q8_0, dot_q8_0);
  set(DType::Q4_0, dot_q4_0);
  set(DType::Q5_0, dot_q5_0);
  set(DType::Q4_K, dot_q4_k);
  set(DType::Q5_K, dot_q5_k);
  set(DType::Q6_K, dot_q6_k);
  set(DType::Q4_1, dot_q4_1);
  set(DType::IQ4_NL, dot_iq4_nl);
  set(DType::IQ4_XS, dot_iq4_xs);
  set(DType::MXFP4, dot_mxfp4);
  set(DType::TQ1_0, dot_tq1_0);
  set(DType::TQ2_0, dot_tq2_0);
  for (DType type : kIqGridFormats)
    visit_iq_grid(type, [&](auto f) { set(type, dot_iq_grid<typename decltype(f)::Block>); });
  table.prepare[size_t(ActKind::Q16)] = prepare_q16;
}

}  // namespace tandem::cpu

// AVX-512 Int16-precision kernels: Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS,
// MXFP4, TQ1_0, TQ2_0, IQ2_XXS, IQ3_XXS against ActKind::Q16 (act_q16.h), and the Q16
// preparation. Other formats use the AVX2 or portable kernels.
//
// One 32-element activation block is one zmm of int16. Weights are widened to int16 (with their
// offsets applied: Q4_0 -8, Q5_0 -16, Q6_K -32, so every weight is signed and |w| <= 128) and
// vpmaddwd gives 16 int32 lanes of pair sums, each at most 2 * 128 * 32767 = 8.4e6: no overflow,
// and the pair (-32768)^2 * 2 that could overflow never occurs since |q| <= 32767. Each block's
// lanes are converted to float once and multiplied by the block's scale (weight scale x activation
// scale, and the sub-block scale for the k-quants) in one FMA; the sum over blocks is in float.
// The scales of 16 consecutive 32-element weight blocks are fetched with one gather and
// converted together, so a block costs about four vector instructions.
#include "backends/cpu/avx512_intrinsics.h"

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "backends/cpu/act_q16.h"
#include "backends/cpu/iq_xxs_avx512.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/kscales.h"
#include "core/blocks.h"
#include "core/dtype.h"

namespace tandem::cpu {
namespace {

inline float f16(uint16_t h) {
  return _cvtsh_ss(h);
}

// Makes the compiler forget what it stored at `p`, so that the FMAs read each scale stored there
// with a broadcast load (a load-port operation) where GCC would otherwise extract and broadcast
// it within registers (two vector ALU operations per block, in loops bound by them).
inline void reload_from_memory(const void* p) {
  asm volatile("" : : "r"(p) : "memory");
}

// Activation block b (32 int16); the row is 64-byte aligned.
inline __m512i load_x(const Q16Row& x, int64_t b) {
  return _mm512_loadu_si512(x.q + 32 * b);
}

// ---- 32-element formats ----

// Σ over blocks of scale_b * Σ lanes of dot(b), where scale_b = the block's weight scale times
// the activation scale. Scales are made 16 blocks at a time (weight_scales(g, mask): blocks g ..
// g + 15), multiplied once; the FMAs then read them broadcast from memory. Two accumulators so
// consecutive blocks' FMAs do not wait on each other.
template <class ScaleFn, class DotFn>
inline float sum_scaled_blocks(const Q16Row& x, int64_t n_blocks, ScaleFn weight_scales,
                               DotFn dot) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  alignas(64) float scale[16];
  for (int64_t g = 0; g < n_blocks; g += 16) {
    const int n = int(std::min<int64_t>(16, n_blocks - g));
    const __mmask16 m = n == 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
    _mm512_store_ps(scale, _mm512_mul_ps(weight_scales(g, m), _mm512_maskz_loadu_ps(m, x.d + g)));
    reload_from_memory(scale);
    int j = 0;
    for (; j + 2 <= n; j += 2) {
      acc0 = _mm512_fmadd_ps(_mm512_set1_ps(scale[j]), _mm512_cvtepi32_ps(dot(g + j)), acc0);
      acc1 =
          _mm512_fmadd_ps(_mm512_set1_ps(scale[j + 1]), _mm512_cvtepi32_ps(dot(g + j + 1)), acc1);
    }
    if (j < n)
      acc0 = _mm512_fmadd_ps(_mm512_set1_ps(scale[j]), _mm512_cvtepi32_ps(dot(g + j)), acc0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

// The first 4 bytes of blocks g .. g + 15 (fewer under the mask) of `block_bytes` each.
inline __m512i gather_block_heads(const uint8_t* base, int block_bytes, int64_t g, __mmask16 m) {
  const __m512i offsets =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(block_bytes));
  return _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, offsets, base + g * block_bytes, 1);
}

// The formats whose blocks start with an f16 scale: one gather, one conversion per 16 blocks.
template <class DotFn>
inline float sum_blocks(const void* weights, int block_bytes, const Q16Row& x, int64_t n_blocks,
                        DotFn dot) {
  const auto* base = static_cast<const uint8_t*>(weights);
  return sum_scaled_blocks(
      x, n_blocks,
      [&](int64_t g, __mmask16 m) {
        return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(gather_block_heads(base, block_bytes, g, m)));
      },
      dot);
}

// The 32 nibbles of 16 bytes as int16 in element order (element j in the low nibble of byte j,
// element j + 16 in the high one): bytes widened twice over, the upper copy shifted down by 4.
inline __m512i unpack_nibbles_16(const uint8_t* qs) {
  const __m512i shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
  const __m512i words = _mm512_cvtepu8_epi16(_mm256_broadcastsi128_si256(load128(qs)));
  return _mm512_and_si512(_mm512_srlv_epi16(words, shift), _mm512_set1_epi16(15));
}

float dot_q8_0(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockQ8_0*>(w);
  const Q16Row x = q16_row(a, cols);
  return sum_blocks(w, sizeof(BlockQ8_0), x, cols / 32, [&](int64_t b) {
    return _mm512_madd_epi16(_mm512_cvtepi8_epi16(load256(wb[b].qs)), load_x(x, b));
  });
}

float dot_q4_0(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockQ4_0*>(w);
  const Q16Row x = q16_row(a, cols);
  return sum_blocks(w, sizeof(BlockQ4_0), x, cols / 32, [&](int64_t b) {
    const __m512i q = _mm512_sub_epi16(unpack_nibbles_16(wb[b].qs), _mm512_set1_epi16(8));
    return _mm512_madd_epi16(q, load_x(x, b));
  });
}

// Q4_1: d · q + m: the d part as Q4_0 without the offset, then Σ m_b · Σ x over the blocks, 16
// blocks at a time (the m fields gathered with their d, the activations' two sums per 16 of each
// block added pairwise).
float dot_q4_1(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockQ4_1*>(w);
  const auto* base = static_cast<const uint8_t*>(w);
  const Q16Row x = q16_row(a, cols);
  const int64_t n_blocks = cols / 32;
  const float scaled = sum_blocks(w, sizeof(BlockQ4_1), x, n_blocks, [&](int64_t b) {
    return _mm512_madd_epi16(unpack_nibbles_16(wb[b].qs), load_x(x, b));
  });
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  __m512 offsets = _mm512_setzero_ps();
  for (int64_t g = 0; g < n_blocks; g += 16) {
    const int n = int(std::min<int64_t>(16, n_blocks - g));
    const __mmask16 m = n == 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
    const __mmask32 m2 = n == 16 ? __mmask32(0xffffffff) : __mmask32((1ull << (2 * n)) - 1);
    const __m512 mins = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(
        _mm512_srli_epi32(gather_block_heads(base, sizeof(BlockQ4_1), g, m), 16)));
    const __m512 lo = _mm512_maskz_loadu_ps(__mmask16(m2), x.sum16 + 2 * g);
    const __m512 hi = _mm512_maskz_loadu_ps(__mmask16(m2 >> 16), x.sum16 + 2 * g + 16);
    const __m512 sums = _mm512_add_ps(_mm512_permutex2var_ps(lo, even, hi),
                                      _mm512_permutex2var_ps(lo, odd, hi));
    offsets = _mm512_mask3_fmadd_ps(mins, sums, offsets, m);
  }
  return scaled + _mm512_reduce_add_ps(offsets);
}

float dot_q5_0(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockQ5_0*>(w);
  const Q16Row x = q16_row(a, cols);
  return sum_blocks(w, sizeof(BlockQ5_0), x, cols / 32, [&](int64_t b) {
    uint32_t qh;
    std::memcpy(&qh, wb[b].qh, sizeof(qh));
    // q - 16 = nibble + 16 * bit - 16: subtract 16 where bit i of qh is clear.
    const __m512i low = unpack_nibbles_16(wb[b].qs);
    const __m512i q = _mm512_mask_sub_epi16(low, __mmask32(~qh), low, _mm512_set1_epi16(16));
    return _mm512_madd_epi16(q, load_x(x, b));
  });
}

// ---- IQ4_NL, IQ4_XS ----

// The 16 levels as int16 (lanes 16..31 unused: indices are 4 bits), for vpermw.
inline __m512i iq4_level_table() {
  return _mm512_cvtepi8_epi16(_mm256_zextsi128_si256(load128(kIq4NlValues)));
}

float dot_iq4_nl(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockIQ4_NL*>(w);
  const Q16Row x = q16_row(a, cols);
  const __m512i levels = iq4_level_table();
  return sum_blocks(w, sizeof(BlockIQ4_NL), x, cols / 32, [&](int64_t b) {
    if (b % 4 == 0) prefetch_ahead(wb + b, 4 * sizeof(BlockIQ4_NL));
    const __m512i q = _mm512_permutexvar_epi16(unpack_nibbles_16(wb[b].qs), levels);
    return _mm512_madd_epi16(q, load_x(x, b));
  });
}

// MXFP4: as IQ4_NL with the doubled E2M1 values for levels, and for the scale the power of two
// of the block's exponent byte e (mxfp4_scale: 2^(e - 128), the float's exponent field e - 1,
// or a subnormal for e < 2).
float dot_mxfp4(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockMXFP4*>(w);
  const auto* base = static_cast<const uint8_t*>(w);
  const Q16Row x = q16_row(a, cols);
  const __m512i levels = _mm512_cvtepi8_epi16(_mm256_zextsi128_si256(load128(kE2M1Doubled.v)));
  auto powers_of_two = [&](int64_t g, __mmask16 m) {
    const __m512i e = _mm512_and_si512(gather_block_heads(base, sizeof(BlockMXFP4), g, m),
                                       _mm512_set1_epi32(0xFF));
    const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    const __m512i subnormal = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    const __mmask16 small = _mm512_cmplt_epi32_mask(e, _mm512_set1_epi32(2));
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(small, normal, subnormal));
  };
  return sum_scaled_blocks(x, cols / 32, powers_of_two, [&](int64_t b) {
    if (b % 4 == 0) prefetch_ahead(wb + b, 4 * sizeof(BlockMXFP4));
    const __m512i q = _mm512_permutexvar_epi16(unpack_nibbles_16(wb[b].qs), levels);
    return _mm512_madd_epi16(q, load_x(x, b));
  });
}

// ---- the ternary formats: x = d · (q - 1), one d per 256 elements (eight activation blocks) ----

// The d of the two 256-blocks that activation blocks g .. g + 15 fall in (g a multiple of 16).
template <class Block>
inline __m512 ternary_scales(const Block* wb, int64_t g, __mmask16 m) {
  const float d0 = f16(wb[g / 8].d), d1 = m >> 8 ? f16(wb[g / 8 + 1].d) : 0.0f;
  return _mm512_insertf32x8(_mm512_set1_ps(d0), _mm256_set1_ps(d1), 1);
}

template <class Block, __m512i (*kGroup)(const Block&, int)>
float dot_ternary(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const Block*>(w);
  const Q16Row x = q16_row(a, cols);
  auto scales = [&](int64_t g, __mmask16 m) { return ternary_scales(wb, g, m); };
  return sum_scaled_blocks(x, cols / 32, scales, [&](int64_t g) {
    const __m512i q = kGroup(wb[g / 8], int(g % 8));
    return _mm512_madd_epi16(_mm512_sub_epi16(q, _mm512_set1_epi16(1)), load_x(x, g));
  });
}

// The eight 6-bit sub-block scales of an IQ4_XS block, less 32, in vector lanes: lane j takes
// nibble j of scales_l and bits 2j, 2j + 1 of scales_h. (Made one by one in scalar code and
// stored for a vector load, the eight stores could not forward to the load: a stall per block.)
inline __m256i iq4_xs_sub_scales(const BlockIQ4_XS& block) {
  uint32_t low;
  std::memcpy(&low, block.scales_l, sizeof(low));
  const __m256i nibble = _mm256_and_si256(
      _mm256_srlv_epi32(_mm256_set1_epi32(int(low)), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
      _mm256_set1_epi32(15));
  const __m256i high = _mm256_and_si256(
      _mm256_srlv_epi32(_mm256_set1_epi32(block.scales_h), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
      _mm256_set1_epi32(3));
  return _mm256_sub_epi32(_mm256_or_si256(nibble, _mm256_slli_epi32(high, 4)), _mm256_set1_epi32(32));
}

// Each sub-block (one activation block) has one float scale d * (scale - 32) * dx, made eight at
// a time.
float dot_iq4_xs(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockIQ4_XS*>(w);
  const Q16Row x = q16_row(a, cols);
  const __m512i levels16 = iq4_level_table();
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                   _mm512_setzero_ps()};
  alignas(32) float scale[8];
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const BlockIQ4_XS& block = wb[b];
    prefetch_ahead(&block, sizeof(block));
    _mm256_store_ps(scale, _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(iq4_xs_sub_scales(block)),
                                                       _mm256_set1_ps(f16(block.d))),
                                         _mm256_loadu_ps(x.d + 8 * b)));
    reload_from_memory(scale);
    for (int sub = 0; sub < 8; sub += 2) {
      // Two sub-blocks' 32 bytes widened to int16 at once; the low nibbles are elements 0..15 of
      // each, the high ones 16..31. Regrouped by sub-block (128-bit lanes), then each index
      // looked up in the 16 levels by one vpermw.
      const __m512i q = _mm512_cvtepu8_epi16(load256(block.qs + 16 * sub));
      const __m512i low = _mm512_and_si512(q, _mm512_set1_epi16(15));
      const __m512i high = _mm512_srli_epi16(q, 4);
      const __m512i first = _mm512_permutexvar_epi16(
          _mm512_shuffle_i64x2(low, high, _MM_SHUFFLE(1, 0, 1, 0)), levels16);
      const __m512i second = _mm512_permutexvar_epi16(
          _mm512_shuffle_i64x2(low, high, _MM_SHUFFLE(3, 2, 3, 2)), levels16);
      const __m512i dot0 = _mm512_madd_epi16(first, load_x(x, 8 * b + sub));
      const __m512i dot1 = _mm512_madd_epi16(second, load_x(x, 8 * b + sub + 1));
      acc[sub % 4] =
          _mm512_fmadd_ps(_mm512_set1_ps(scale[sub]), _mm512_cvtepi32_ps(dot0), acc[sub % 4]);
      acc[sub % 4 + 1] = _mm512_fmadd_ps(_mm512_set1_ps(scale[sub + 1]), _mm512_cvtepi32_ps(dot1),
                                         acc[sub % 4 + 1]);
    }
  }
  return _mm512_reduce_add_ps(
      _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

// ---- k-quants ----

// Q4_K and Q5_K: sub-block j (32 elements) is activation block 8b + j, so each has one float
// scale d * scale_j * dx_j (made 8 at a time); the mins go through the activation sums per 16.
template <bool kFifthBit, class Block>
inline float dot_q4_q5_k(const Block* wb, const void* a, int64_t cols) {
  const Q16Row x = q16_row(a, cols);
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                   _mm512_setzero_ps()};
  __m512 mins_acc = _mm512_setzero_ps();
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
    const __m512 mins = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(bytes, bytes)));
    mins_acc = _mm512_fmadd_ps(_mm512_mul_ps(mins, _mm512_set1_ps(f16(block.dmin))),
                               _mm512_loadu_ps(x.sum16 + 16 * b), mins_acc);
    __m256i qh = _mm256_setzero_si256();
    if constexpr (kFifthBit) qh = load256(block.qh);
    for (int c = 0; c < 4; ++c) {
      // 32 bytes: low nibbles are sub-block 2c, high nibbles 2c + 1. Widened to int16 first,
      // so the high nibble needs only a shift.
      const __m512i q = _mm512_cvtepu8_epi16(load256(block.qs + 32 * c));
      __m512i lo = _mm512_and_si512(q, _mm512_set1_epi16(15));
      __m512i hi = _mm512_srli_epi16(q, 4);
      if constexpr (kFifthBit) {
        // Bit 2c of qh[i] is the fifth bit of element i of sub-block 2c, bit 2c + 1 of 2c + 1.
        const __mmask32 h_lo = _mm256_test_epi8_mask(qh, _mm256_set1_epi8(char(1 << (2 * c))));
        const __mmask32 h_hi = _mm256_test_epi8_mask(qh, _mm256_set1_epi8(char(2 << (2 * c))));
        lo = _mm512_mask_add_epi16(lo, h_lo, lo, _mm512_set1_epi16(16));
        hi = _mm512_mask_add_epi16(hi, h_hi, hi, _mm512_set1_epi16(16));
      }
      const __m512i dot_lo = _mm512_madd_epi16(lo, load_x(x, 8 * b + 2 * c));
      const __m512i dot_hi = _mm512_madd_epi16(hi, load_x(x, 8 * b + 2 * c + 1));
      acc[(2 * c) % 4] = _mm512_fmadd_ps(_mm512_set1_ps(scale[2 * c]), _mm512_cvtepi32_ps(dot_lo),
                                         acc[(2 * c) % 4]);
      acc[(2 * c + 1) % 4] = _mm512_fmadd_ps(_mm512_set1_ps(scale[2 * c + 1]),
                                             _mm512_cvtepi32_ps(dot_hi), acc[(2 * c + 1) % 4]);
    }
  }
  const __m512 total = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
  return _mm512_reduce_add_ps(_mm512_sub_ps(total, mins_acc));
}

float dot_q4_k(const void* w, const void* a, int64_t cols) {
  return dot_q4_q5_k<false>(static_cast<const BlockQ4_K*>(w), a, cols);
}

float dot_q5_k(const void* w, const void* a, int64_t cols) {
  return dot_q4_q5_k<true>(static_cast<const BlockQ5_K*>(w), a, cols);
}

// Q6_K: 16 sub-blocks of 16, two per activation block. vpmaddwd puts elements 0..15 of a block
// in lanes 0..7 and 16..31 in lanes 8..15, so one float vector [s_k x 8, s_k+1 x 8] (sub-block
// scale x d x dx, permuted out of the 16 made per super-block) scales a block in one FMA.
float dot_q6_k(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockQ6_K*>(w);
  const Q16Row x = q16_row(a, cols);
  const __m256i low4 = _mm256_set1_epi8(15);
  const __m256i bits45 = _mm256_set1_epi8(0x30);
  const __m256i offset = _mm256_set1_epi8(32);
  // Lane k of the 16 scales: sub-block k, whose activation block is k / 2.
  const __m512i pair_of = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  const __m512i pair_index = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                   _mm512_setzero_ps()};
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const BlockQ6_K& block = wb[b];
    const __m512 dx =
        _mm512_permutexvar_ps(pair_of, _mm512_castps256_ps512(_mm256_loadu_ps(x.d + 8 * b)));
    const __m512 sub_scales = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load128(block.scales)));
    const __m512 scales =
        _mm512_mul_ps(_mm512_mul_ps(sub_scales, dx), _mm512_set1_ps(f16(block.d)));
    for (int half = 0; half < 2; ++half) {
      const __m256i ql0 = load256(block.ql + 64 * half);
      const __m256i ql1 = load256(block.ql + 64 * half + 32);
      const __m256i qh = load256(block.qh + 32 * half);
      // Element 32p + i: low 4 bits from ql0/ql1 (low nibble for p < 2, high for p >= 2), high
      // 2 bits from bits 2p, 2p+1 of qh[i], moved to bits 4-5. (A & B) | C = 0xEA.
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
      for (int p = 0; p < 4; ++p) {
        // q - 32 in -32..31: subtracted as bytes, then sign-extended.
        const __m512i w16 = _mm512_cvtepi8_epi16(_mm256_sub_epi8(q[p], offset));
        const __m512i dot = _mm512_madd_epi16(w16, load_x(x, 8 * b + 4 * half + p));
        const int k = 8 * half + 2 * p;
        const __m512 scale =
            _mm512_permutexvar_ps(_mm512_add_epi32(pair_index, _mm512_set1_epi32(k)), scales);
        acc[p] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(dot), acc[p]);
      }
    }
  }
  return _mm512_reduce_add_ps(
      _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

// ---- activation preparation ----
// Bit for bit the portable preparer: the same amax (max is exact and order-free), the same
// 32767 / amax and product, cvtps2dq rounding to nearest even as the portable trick does, and the
// sums exact in int32 before the one rounding of d * Σq.
void prepare_q16(const float* x, void* act_row, int64_t cols) {
  const Q16RowOut row = q16_row_out(act_row, cols);
  const __m512 sign = _mm512_set1_ps(-0.0f);
  for (int64_t b = 0; b < cols / 32; ++b) {
    const __m512 x0 = _mm512_loadu_ps(x + 32 * b);
    const __m512 x1 = _mm512_loadu_ps(x + 32 * b + 16);
    const float amax =
        _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign, x0), _mm512_andnot_ps(sign, x1)));
    const __m512 inverse = _mm512_set1_ps(amax > 0.0f ? kQ16Max / amax : 0.0f);
    const float d = amax / kQ16Max;
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, inverse));
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, inverse));
    // |q| <= 32767, so the narrowing (truncating vpmovdw) is exact.
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(row.q + 32 * b), _mm512_cvtepi32_epi16(q0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(row.q + 32 * b + 16), _mm512_cvtepi32_epi16(q1));
    row.d[b] = d;
    row.sum16[2 * b] = d * float(_mm512_reduce_add_epi32(q0));
    row.sum16[2 * b + 1] = d * float(_mm512_reduce_add_epi32(q1));
  }
}

// IQ2_XXS and IQ3_XXS, 64 weights at a time (their grids in registers, iq_xxs_avx512.h): the
// grid values widened to int16 against the activations with the weights' signs moved onto them
// (masked negates; |q| <= 32767), then as the other formats, each chunk's scale times the
// activation scale in one FMA.
template <class Block>
float dot_xxs(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const Block*>(w);
  const Q16Row x = q16_row(a, cols);
  const XxsGrid grid = xxs_grid<Block>();
  __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
  alignas(64) float scales[16];
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const Block& block = wb[b];
    prefetch_ahead(&block, sizeof(block));
    _mm512_store_ps(scales, xxs_block_scales(block, f16(block.d)));
    reload_from_memory(scales);
    const XxsBlockCodes codes = xxs_block_codes(block, grid);
    for (int p = 0; p < 4; ++p) {
      const __m512i points = xxs_pair_points<Block>(codes, p);
      const __mmask64 signs = xxs_pair_signs(block, p);
      const int64_t chunk = 8 * b + 2 * p;
      const __m512i x0 = load_x(x, chunk), x1 = load_x(x, chunk + 1);
      const __m512i zero = _mm512_setzero_si512();
      const __m512i dot0 = _mm512_madd_epi16(_mm512_cvtepu8_epi16(_mm512_castsi512_si256(points)),
                                             _mm512_mask_sub_epi16(x0, __mmask32(signs), zero, x0));
      const __m512i dot1 =
          _mm512_madd_epi16(_mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(points, 1)),
                            _mm512_mask_sub_epi16(x1, __mmask32(signs >> 32), zero, x1));
      const float scale0 = scales[xxs_scale_lane<Block>(2 * p)] * x.d[chunk];
      const float scale1 = scales[xxs_scale_lane<Block>(2 * p + 1)] * x.d[chunk + 1];
      acc[0] = _mm512_fmadd_ps(_mm512_set1_ps(scale0), _mm512_cvtepi32_ps(dot0), acc[0]);
      acc[1] = _mm512_fmadd_ps(_mm512_set1_ps(scale1), _mm512_cvtepi32_ps(dot1), acc[1]);
    }
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]));
}

}  // namespace

void fill_avx512_q16_kernels(KernelTable& table) {
  auto set = [&](DType type, RowDotFn dot) {
    table.formats[size_t(ActPrecision::Int16)][size_t(type)] = {ActKind::Q16, dot};
  };
  set(DType::Q8_0, dot_q8_0);
  set(DType::Q4_0, dot_q4_0);
  set(DType::Q5_0, dot_q5_0);
  set(DType::Q4_K, dot_q4_k);
  set(DType::Q5_K, dot_q5_k);
  set(DType::Q6_K, dot_q6_k);
  set(DType::IQ4_NL, dot_iq4_nl);
  set(DType::Q4_1, dot_q4_1);
  set(DType::MXFP4, dot_mxfp4);
  set(DType::IQ4_XS, dot_iq4_xs);
  set(DType::TQ1_0, dot_ternary<BlockTQ1_0, tq1_0_group>);
  set(DType::TQ2_0, dot_ternary<BlockTQ2_0, tq2_0_group>);
  // The other grid i-quants keep the AVX2 kernels (filled first; an AVX-512 copy measured the same).
  set(DType::IQ2_XXS, dot_xxs<BlockIQ2_XXS>);  // their grids in registers
  set(DType::IQ3_XXS, dot_xxs<BlockIQ3_XXS>);
  table.prepare[size_t(ActKind::Q16)] = prepare_q16;
}

}  // namespace tandem::cpu

// AVX-512 kernels (F, BW, VL, DQ, VNNI, BF16, and BMI2's pdep). Float formats use 512-bit vectors
// with masked tails. Integer formats mostly use 256-bit vectors with the VNNI forms: vpdpbusd (u8 x
// s8 summed in 4s into int32, no saturation) and vpdpwssd (the madd + add of AVX2 in one
// instruction). On Zen 4 a 512-bit op costs two 256-bit ones, so the narrower form loses nothing
// there and keeps the block layouts (32 or 64 elements per step) simple; Zen 5 and Intel run
// 512-bit ops at full width, which the Q4_K/Q5_K row dots (the experts' decode kernel) now use.
#include "backends/cpu/avx512_intrinsics.h"

#include <cstring>

#include "backends/cpu/iq_xxs_avx512.h"
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

inline float f16(uint16_t h) {
  return _cvtsh_ss(h);
}


// ---- float formats ----

float dot_f32(const void* w, const void* a, int64_t cols) {
  const auto* wr = static_cast<const float*>(w);
  const auto* x = static_cast<const float*>(a);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  __m512 acc2 = _mm512_setzero_ps(), acc3 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 64 <= cols; i += 64) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(wr + i), _mm512_loadu_ps(x + i), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(wr + i + 16), _mm512_loadu_ps(x + i + 16), acc1);
    acc2 = _mm512_fmadd_ps(_mm512_loadu_ps(wr + i + 32), _mm512_loadu_ps(x + i + 32), acc2);
    acc3 = _mm512_fmadd_ps(_mm512_loadu_ps(wr + i + 48), _mm512_loadu_ps(x + i + 48), acc3);
  }
  for (; i < cols; i += 16) {
    const __mmask16 m = cols - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (cols - i)) - 1);
    acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, wr + i), _mm512_maskz_loadu_ps(m, x + i), acc0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));
}

float dot_f16(const void* w, const void* a, int64_t cols) {
  const auto* wr = static_cast<const uint16_t*>(w);
  const auto* x = static_cast<const float*>(a);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= cols; i += 32) {
    acc0 = _mm512_fmadd_ps(_mm512_cvtph_ps(load256(wr + i)), _mm512_loadu_ps(x + i), acc0);
    acc1 =
        _mm512_fmadd_ps(_mm512_cvtph_ps(load256(wr + i + 16)), _mm512_loadu_ps(x + i + 16), acc1);
  }
  for (; i < cols; i += 16) {
    const __mmask16 m = cols - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (cols - i)) - 1);
    acc0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, wr + i)),
                           _mm512_maskz_loadu_ps(m, x + i), acc0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

// BF16 weights against f32 activations (the Int16 precision): widening bf16 is a shift.
float dot_bf16_f32(const void* w, const void* a, int64_t cols) {
  const auto* wr = static_cast<const uint16_t*>(w);
  const auto* x = static_cast<const float*>(a);
  auto widen = [](__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  };
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= cols; i += 32) {
    acc0 = _mm512_fmadd_ps(widen(load256(wr + i)), _mm512_loadu_ps(x + i), acc0);
    acc1 = _mm512_fmadd_ps(widen(load256(wr + i + 16)), _mm512_loadu_ps(x + i + 16), acc1);
  }
  for (; i < cols; i += 16) {
    const __mmask16 m = cols - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (cols - i)) - 1);
    acc0 = _mm512_fmadd_ps(widen(_mm256_maskz_loadu_epi16(m, wr + i)),
                           _mm512_maskz_loadu_ps(m, x + i), acc0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

// BF16 weights against bf16-rounded activations (ActKind::BF16, the Int8 precision): vdpbf16ps
// multiplies 32 pairs and accumulates in f32. The rounding of x costs up to 2^-9 relative per
// element.
float dot_bf16(const void* w, const void* a, int64_t cols) {
  const auto* wr = static_cast<const uint16_t*>(w);
  const auto* x = static_cast<const uint16_t*>(a);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  auto bf = [](__m512i v) { return (__m512bh)v; };
  int64_t i = 0;
  for (; i + 64 <= cols; i += 64) {
    acc0 = _mm512_dpbf16_ps(acc0, bf(_mm512_loadu_si512(wr + i)), bf(_mm512_loadu_si512(x + i)));
    acc1 = _mm512_dpbf16_ps(acc1, bf(_mm512_loadu_si512(wr + i + 32)),
                            bf(_mm512_loadu_si512(x + i + 32)));
  }
  for (; i < cols; i += 32) {
    const __mmask32 m = cols - i >= 32 ? __mmask32(0xffffffff) : __mmask32((1u << (cols - i)) - 1);
    acc0 = _mm512_dpbf16_ps(acc0, bf(_mm512_maskz_loadu_epi16(m, wr + i)),
                            bf(_mm512_maskz_loadu_epi16(m, x + i)));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

// ---- 32-element formats against ActBlockQ8 ----
// vpdpbusd wants one unsigned operand. Weights are made unsigned (Q8_0: w + 128 by flipping the
// sign bit; Q4_0/Q5_0: the stored q before its offset) and the offset times Σx is put into the
// accumulator's starting value: an offset o over 32 elements is o * Σx / 8 in each of 8 lanes.

inline __m256 block_product(__m256i dot, float scale, __m256 acc) {
  return _mm256_fmadd_ps(_mm256_set1_ps(scale), _mm256_cvtepi32_ps(dot), acc);
}

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

float dot_q8_0(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockQ8_0*>(w);
  const auto* xb = static_cast<const ActBlockQ8*>(a);
  const __m256i sign_bit = _mm256_set1_epi8(char(0x80));
  return sum_blocks(cols / 32, [&](int64_t b, __m256 acc) {
    const __m256i q = _mm256_xor_si256(load256(wb[b].qs), sign_bit);
    const __m256i dot =
        _mm256_dpbusd_epi32(_mm256_set1_epi32(-16 * xb[b].sum), q, load256(xb[b].qs));
    return block_product(dot, f16(wb[b].d) * xb[b].d, acc);
  });
}

float dot_q4_0(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockQ4_0*>(w);
  const auto* xb = static_cast<const ActBlockQ8*>(a);
  return sum_blocks(cols / 32, [&](int64_t b, __m256 acc) {
    const __m256i dot = _mm256_dpbusd_epi32(_mm256_set1_epi32(-xb[b].sum),
                                            unpack_nibbles_32(wb[b].qs), load256(xb[b].qs));
    return block_product(dot, f16(wb[b].d) * xb[b].d, acc);
  });
}

float dot_q5_0(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockQ5_0*>(w);
  const auto* xb = static_cast<const ActBlockQ8*>(a);
  return sum_blocks(cols / 32, [&](int64_t b, __m256 acc) {
    uint32_t qh;
    std::memcpy(&qh, wb[b].qh, sizeof(qh));
    // Bit i of qh is the fifth bit of element i: it is a byte mask for adding 16.
    const __m256i low = unpack_nibbles_32(wb[b].qs);
    const __m256i q = _mm256_mask_add_epi8(low, __mmask32(qh), low, _mm256_set1_epi8(16));
    const __m256i dot =
        _mm256_dpbusd_epi32(_mm256_set1_epi32(-2 * xb[b].sum), q, load256(xb[b].qs));
    return block_product(dot, f16(wb[b].d) * xb[b].d, acc);
  });
}

// ---- k-quants against BlockQ8_K ----
// As in the AVX2 file: maddubs gives int16 pair sums (no saturation for <= 6-bit weights), and
// vpdpwssd multiplies them by the sub-block scale and accumulates in int32.

// 64 weights a step in 512-bit registers: chunk c's 32 bytes in both halves, the low nibbles
// (sub-block 2c) taken in the low half and the high ones (2c + 1) in the high half, each half
// against its own 32 activations and scale. Per lane the integer sums are the 256-bit version's
// (the two halves are added before the float step), so the result is too, in about three
// quarters of the instructions: the decode kernel's limit on this CPU's two 512-bit pipes
// (matmul_bench 1408x2048, one thread: 83 -> 70 us). Q4_K and Q5_K differ only in the fifth bit.
template <bool kFifthBit, class Block>
inline float dot_q4_q5_k(const Block* wb, const BlockQ8_K* xb, int64_t cols) {
  const __m512i low4 = _mm512_set1_epi8(15), sixteen = _mm512_set1_epi8(16);
  const __m512i nibble_shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
  __m256 acc = _mm256_setzero_ps();
  __m256 mins_acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const Block& block = wb[b];
    alignas(16) uint32_t words[4];
    unpack_k_scales_words(block.scales, words);
    const __m128i scale_bytes = _mm_load_si128(reinterpret_cast<const __m128i*>(words));
    const __m512i scales = _mm512_castsi128_si512(_mm_cvtepu8_epi16(scale_bytes));  // 8 x int16
    const int8_t* x = xb[b].qs;
    __m512i qh = _mm512_setzero_si512();
    if constexpr (kFifthBit) qh = _mm512_broadcast_i64x4(load256(block.qh));
    // Two accumulators: vpdpwssd's latency would otherwise set the pace.
    __m512i dot[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
    for (int c = 0; c < 4; ++c) {
      __m512i q = _mm512_and_si512(
          _mm512_srlv_epi16(_mm512_broadcast_i64x4(load256(block.qs + 32 * c)), nibble_shift),
          low4);
      if constexpr (kFifthBit) {
        // Bit 2c of qh[i] belongs to the low nibbles' sub-block, bit 2c + 1 to the high ones'.
        const __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8(char(1 << (2 * c))),
                                               _mm256_set1_epi8(char(2 << (2 * c))), 1);
        q = _mm512_mask_add_epi8(q, _mm512_test_epi8_mask(qh, bit), q, sixteen);
      }
      const __m512i products = _mm512_maddubs_epi16(q, _mm512_loadu_si512(x + 64 * c));
      const __m512i scale_pair =
          _mm512_permutexvar_epi16(_mm512_inserti64x4(_mm512_set1_epi16(short(2 * c)),
                                                      _mm256_set1_epi16(short(2 * c + 1)), 1),
                                   scales);
      dot[c % 2] = _mm512_dpwssd_epi32(dot[c % 2], products, scale_pair);
    }
    const __m512i both = _mm512_add_epi32(dot[0], dot[1]);
    const __m256i total =
        _mm256_add_epi32(_mm512_castsi512_si256(both), _mm512_extracti64x4_epi64(both, 1));
    acc = block_product(total, xb[b].d * f16(block.d), acc);
    const __m256i mins = _mm256_madd_epi16(
        _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(scale_bytes, scale_bytes)), load256(xb[b].bsums));
    mins_acc = block_product(mins, xb[b].d * f16(block.dmin), mins_acc);
  }
  return hsum(_mm256_sub_ps(acc, mins_acc));
}

float dot_q4_k(const void* w, const void* a, int64_t cols) {
  return dot_q4_q5_k<false>(static_cast<const BlockQ4_K*>(w), static_cast<const BlockQ8_K*>(a),
                            cols);
}

float dot_q5_k(const void* w, const void* a, int64_t cols) {
  return dot_q4_q5_k<true>(static_cast<const BlockQ5_K*>(w), static_cast<const BlockQ8_K*>(a),
                           cols);
}

float dot_q6_k(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockQ6_K*>(w);
  const auto* xb = static_cast<const BlockQ8_K*>(a);
  const __m256i low4 = _mm256_set1_epi8(15);
  const __m256i bits45 = _mm256_set1_epi8(0x30);
  // Lane pattern [k x 8, k+1 x 8] for picking the scales of two sub-blocks of 16.
  const __m256i pair_index = _mm256_setr_epi16(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const BlockQ6_K& block = wb[b];
    const __m256i scales = _mm256_cvtepi8_epi16(load128(block.scales));  // 16 x int16
    // The -32 offset: Σ_k scale_k * bsums_k, taken out of the integer sum at the end.
    const __m256i offsets = _mm256_madd_epi16(scales, load256(xb[b].bsums));
    // One accumulator per bit plane p, so the vpdpwssd chains are two long, not eight.
    __m256i dot[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                      _mm256_setzero_si256()};
    for (int half = 0; half < 2; ++half) {
      const __m256i ql0 = load256(block.ql + 64 * half);
      const __m256i ql1 = load256(block.ql + 64 * half + 32);
      const __m256i qh = load256(block.qh + 32 * half);
      const int8_t* x = xb[b].qs + 128 * half;
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
        const __m256i prod = _mm256_maddubs_epi16(q[p], load256(x + 32 * p));
        const __m256i index =
            _mm256_add_epi16(pair_index, _mm256_set1_epi16(short(8 * half + 2 * p)));
        dot[p] = _mm256_dpwssd_epi32(dot[p], prod, _mm256_permutexvar_epi16(index, scales));
      }
    }
    const __m256i total =
        _mm256_add_epi32(_mm256_add_epi32(dot[0], dot[1]), _mm256_add_epi32(dot[2], dot[3]));
    acc = block_product(_mm256_sub_epi32(total, _mm256_slli_epi32(offsets, 5)),
                        xb[b].d * f16(block.d), acc);
  }
  return hsum(acc);
}

// x rounded to bf16 (nearest even) for dot_bf16, 16 at a time.
void prepare_bf16(const float* x, void* act_row, int64_t cols) {
  auto* out = static_cast<uint16_t*>(act_row);
  for (int64_t i = 0; i < cols; i += 16) {
    const __mmask16 m = cols - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (cols - i)) - 1);
    const __m256i h = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + i));
    _mm256_mask_storeu_epi16(out + i, m, h);
  }
}

// ---- IQ2_XXS and IQ3_XXS against BlockQ8_K ----
// Per 64 weights (iq_xxs_avx512.h): the unsigned grid values against the activations with the
// weights' signs moved onto them (a masked negate; the quants are never -128), one vpdpbusd;
// lanes 0-7 hold the first chunk's sums, 8-15 the second's, each scaled in float by its chunk's
// scale times the activations' d.
template <class Block>
float dot_xxs(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const Block*>(w);
  const auto* xb = static_cast<const BlockQ8_K*>(a);
  const XxsGrid grid = xxs_grid<Block>();
  __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const Block& block = wb[b];
    prefetch_ahead(&block, sizeof(block));
    const __m512 scales = xxs_block_scales(block, f16(block.d) * xb[b].d);
    const XxsBlockCodes codes = xxs_block_codes(block, grid);
    for (int p = 0; p < 4; ++p) {
      const __m512i x = _mm512_loadu_si512(xb[b].qs + 64 * p);
      const __m512i signed_x = _mm512_mask_sub_epi8(x, xxs_pair_signs(block, p), _mm512_setzero_si512(), x);
      const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), xxs_pair_points<Block>(codes, p), signed_x);
      acc[p & 1] = _mm512_fmadd_ps(xxs_pair_scales<Block>(scales, p), _mm512_cvtepi32_ps(dot), acc[p & 1]);
    }
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]));
}

}  // namespace

void fill_avx512_kernels(KernelTable& table) {
  // Float formats serve both precisions; the 8-bit kernels only Int8.
  auto set = [&](DType type, ActKind act, RowDotFn dot) {
    table.formats[size_t(ActPrecision::Int8)][size_t(type)] = {act, dot};
    if (act == ActKind::F32) table.formats[size_t(ActPrecision::Int16)][size_t(type)] = {act, dot};
  };
  set(DType::F32, ActKind::F32, dot_f32);
  set(DType::F16, ActKind::F32, dot_f16);
  set(DType::BF16, ActKind::BF16, dot_bf16);
  table.formats[size_t(ActPrecision::Int16)][size_t(DType::BF16)] = {ActKind::F32, dot_bf16_f32};
  set(DType::Q8_0, ActKind::Q8, dot_q8_0);
  set(DType::Q4_0, ActKind::Q8, dot_q4_0);
  set(DType::Q5_0, ActKind::Q8, dot_q5_0);
  set(DType::Q4_K, ActKind::Q8_K, dot_q4_k);
  set(DType::Q5_K, ActKind::Q8_K, dot_q5_k);
  set(DType::Q6_K, ActKind::Q8_K, dot_q6_k);
  // The other grid i-quants keep the AVX2 kernels (filled first): an AVX-512 copy of them measured
  // the same (IQ1_S, IQ2_S, IQ3_S at 1408x2048 within 10% either way).
  set(DType::IQ2_XXS, ActKind::Q8_K, dot_xxs<BlockIQ2_XXS>);  // their grids in registers
  set(DType::IQ3_XXS, ActKind::Q8_K, dot_xxs<BlockIQ3_XXS>);
  table.prepare[size_t(ActKind::BF16)] = prepare_bf16;
}

}  // namespace tandem::cpu

// AVX-512 Int16-precision kernels for tandem's 16-row interleaved formats (Q8_0_R16, Q5_0_R16,
// Q4_K_R16; layouts in core/blocks.h) against ActKind::Q16 activations: one call gives 16 rows' dot
// products with one token.
//
// Why: the one-row kernels (dot_q16_avx512.cpp) spend about four vector instructions per 32
// weights on turning a block's integer sum into a float and scaling it, and decode on a 2-core
// machine is bound by those instructions, not by memory (matmul_bench: ~22 GB/s per core even
// from cache). With 16 rows in the 32 int16 lanes of a vector, one vpdpwssd adds two columns'
// products for all 16 rows against one broadcast activation pair, and the float work per 32
// columns is shared by 16 rows. The integer sums per 32 columns are exact, as in the one-row
// kernels (|w| <= 128, |q| <= 32767, 32 products < 2^31); the float steps differ in order, so
// the results differ from the one-row kernels by rounding only (same error bound in the tests).
#include "backends/cpu/avx512_intrinsics.h"

#include <cstdint>
#include <cstring>

#include "backends/cpu/act_q16.h"
#include "backends/cpu/kernels.h"
#include "core/blocks.h"
#include "core/dtype.h"

namespace tandem::cpu {
namespace {

// The activation pair (q[2i], q[2i + 1]) in every int32 lane.
inline __m512i pair(const int16_t* q, int64_t i) {
  int32_t bits;
  std::memcpy(&bits, q + 2 * i, sizeof(bits));
  return _mm512_set1_epi32(bits);
}

inline __m512i widen_bytes(const int8_t* p) {
  return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

inline __m512i widen_nibble_bytes(const uint8_t* p) {
  return _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

inline __m512 bytes_to_float(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// Q8_0_R16: per 32-column block, 16 vpdpwssd (four accumulators: a vpdpwssd waits for the one
// before it on the same accumulator, and chains of four keep the units busy where chains of
// eight did not), then out += float(sum) * (d_row * dx).
void group_dot_q8_0(const void* w, const void* a, int64_t cols, float* out) {
  const auto* blocks = static_cast<const BlockQ8_0_R16*>(w);
  const Q16Row x = q16_row(a, cols);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t b = 0; b < cols / 32; ++b) {
    const BlockQ8_0_R16& block = blocks[b];
    prefetch_ahead(&block, sizeof(block));
    __m512i sum[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                      _mm512_setzero_si512()};
    for (int c = 0; c < 16; ++c)
      sum[c % 4] = _mm512_dpwssd_epi32(sum[c % 4], widen_bytes(block.qs + 32 * c), pair(x.q, 16 * b + c));
    const __m512i total =
        _mm512_add_epi32(_mm512_add_epi32(sum[0], sum[1]), _mm512_add_epi32(sum[2], sum[3]));
    const __m512 scale = _mm512_mul_ps(half_to_float(block.d), _mm512_set1_ps(x.d[b]));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), scale, acc);
  }
  _mm512_storeu_ps(out, acc);
}

// Q4_K_R16: per sub-block of 32 columns, 16 vpdpwssd on the nibbles widened to int16 (the low
// nibble masked, the high one shifted down), four accumulators; then per super-block
// out += d * Σ_j float(sum_j) * scale_j * dx_j - dmin * Σ_j min_j * Σx_j.
void group_dot_q4_k(const void* w, const void* a, int64_t cols, float* out) {
  const auto* blocks = static_cast<const BlockQ4_K_R16*>(w);
  const Q16Row x = q16_row(a, cols);
  const __m512i low4 = _mm512_set1_epi16(15);
  __m512 acc = _mm512_setzero_ps(), mins_acc = _mm512_setzero_ps();
  for (int64_t s = 0; s < cols / kQK_K; ++s) {
    const BlockQ4_K_R16& block = blocks[s];
    __m512 scaled = _mm512_setzero_ps(), mins = _mm512_setzero_ps();
    for (int j = 0; j < 8; ++j) {
      const int64_t first_pair = 128 * s + 16 * j;  // of this sub-block's 32 columns
      prefetch_ahead(block.qs[j], sizeof(block.qs[j]));
      __m512i sum[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                        _mm512_setzero_si512()};
      for (int c = 0; c < 8; c += 2) {
        // Chunk c: columns 4c, 4c + 1 in the low nibbles, 4c + 2, 4c + 3 in the high ones.
        const __m512i q0 = widen_nibble_bytes(block.qs[j] + 32 * c);
        const __m512i q1 = widen_nibble_bytes(block.qs[j] + 32 * c + 32);
        sum[0] = _mm512_dpwssd_epi32(sum[0], _mm512_and_si512(q0, low4), pair(x.q, first_pair + 2 * c));
        sum[1] = _mm512_dpwssd_epi32(sum[1], _mm512_srli_epi16(q0, 4), pair(x.q, first_pair + 2 * c + 1));
        sum[2] = _mm512_dpwssd_epi32(sum[2], _mm512_and_si512(q1, low4), pair(x.q, first_pair + 2 * c + 2));
        sum[3] = _mm512_dpwssd_epi32(sum[3], _mm512_srli_epi16(q1, 4), pair(x.q, first_pair + 2 * c + 3));
      }
      const __m512i total =
          _mm512_add_epi32(_mm512_add_epi32(sum[0], sum[1]), _mm512_add_epi32(sum[2], sum[3]));
      const int64_t block32 = 8 * s + j;
      const __m512 scale = _mm512_mul_ps(bytes_to_float(block.scales[j]), _mm512_set1_ps(x.d[block32]));
      scaled = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), scale, scaled);
      const float x_sum = x.sum16[2 * block32] + x.sum16[2 * block32 + 1];
      mins = _mm512_fmadd_ps(bytes_to_float(block.mins[j]), _mm512_set1_ps(x_sum), mins);
    }
    acc = _mm512_fmadd_ps(scaled, half_to_float(block.d), acc);
    mins_acc = _mm512_fmadd_ps(mins, half_to_float(block.dmin), mins_acc);
  }
  _mm512_storeu_ps(out, _mm512_sub_ps(acc, mins_acc));
}

// Q5_0_R16: as Q4_K_R16's nibbles, then q - 16 = nibble + 16 * bit - 16 with the fifth bits as
// lane masks; per 32-column block out += float(sum) * (d_row * dx).
void group_dot_q5_0(const void* w, const void* a, int64_t cols, float* out) {
  const auto* blocks = static_cast<const BlockQ5_0_R16*>(w);
  const Q16Row x = q16_row(a, cols);
  const __m512i low4 = _mm512_set1_epi16(15), sixteen = _mm512_set1_epi16(16);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t b = 0; b < cols / 32; ++b) {
    const BlockQ5_0_R16& block = blocks[b];
    prefetch_ahead(&block, sizeof(block));
    __m512i sum[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                      _mm512_setzero_si512()};
    for (int c = 0; c < 8; ++c) {
      const __m512i q = widen_nibble_bytes(block.qs[c]);
      const __m512i lo = _mm512_sub_epi16(_mm512_and_si512(q, low4), sixteen);
      const __m512i hi = _mm512_sub_epi16(_mm512_srli_epi16(q, 4), sixteen);
      const __m512i w_lo = _mm512_mask_add_epi16(lo, __mmask32(block.qh[c][0]), lo, sixteen);
      const __m512i w_hi = _mm512_mask_add_epi16(hi, __mmask32(block.qh[c][1]), hi, sixteen);
      sum[(2 * c) % 4] = _mm512_dpwssd_epi32(sum[(2 * c) % 4], w_lo, pair(x.q, 16 * b + 2 * c));
      sum[(2 * c + 1) % 4] = _mm512_dpwssd_epi32(sum[(2 * c + 1) % 4], w_hi, pair(x.q, 16 * b + 2 * c + 1));
    }
    const __m512i total =
        _mm512_add_epi32(_mm512_add_epi32(sum[0], sum[1]), _mm512_add_epi32(sum[2], sum[3]));
    const __m512 scale = _mm512_mul_ps(half_to_float(block.d), _mm512_set1_ps(x.d[b]));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), scale, acc);
  }
  _mm512_storeu_ps(out, acc);
}

}  // namespace

void fill_avx512_group_kernels(KernelTable& table) {
  table.group_dots[size_t(DType::Q8_0)] = group_dot_q8_0;
  table.group_dots[size_t(DType::Q5_0)] = group_dot_q5_0;
  table.group_dots[size_t(DType::Q4_K)] = group_dot_q4_k;
}

}  // namespace tandem::cpu

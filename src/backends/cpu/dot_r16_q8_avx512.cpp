// AVX-512 Int8-precision kernels for tandem's 16-row interleaved formats (Q8_0_R16, Q5_0_R16,
// Q4_K_R16; layouts in core/blocks.h) against the 8-bit activations their plain formats take
// (ActBlockQ8 for Q8_0 and Q5_0, BlockQ8_K for Q4_K): one call gives 16 rows' dot products with
// one token, as dot_r16_avx512.cpp's 16-bit kernels do.
//
// Why: decode of a repacked file ran those 16-bit kernels even where the precision policy takes
// the FFNs at 8 bits. One vpdpbusd adds four columns' products for 16 rows, where vpdpwssd adds
// two, and the weights stay bytes (no widening to int16): matmul_bench l2/ (one token, 256 rows
// in L2, one thread) Q4_K_R16 9.6 -> 8.2 us, Q8_0_R16 8.5 -> 6.4, Q5_0_R16 14.2 -> 11.3.
//
// The pair layout puts a row's two bytes of a chunk side by side, so a 32-bit lane of four
// columns of one row is gathered in registers: for Q8_0 by vpermb over two chunks; for the
// nibble formats by vpmultishiftqb over one chunk broadcast to both halves, which picks each
// row's four nibbles (columns 4c .. 4c + 3) out of its two bytes. A qword holds four rows, so
// that gathers rows {0, 1, 4, 5, ...} in the low half and {2, 3, 6, 7, ...} in the high half:
// kNibbleLaneRow below. Q5_0's block sums are put back in row order before their scales;
// Q4_K's stay in lane order, its scales brought to that order instead, until the end.
//
// The integer sums are exact (the bounds at each kernel) and are the plain kernels' sums; the
// float steps are per row instead of over eight lanes, so results differ from the plain format's
// 8-bit row dots by rounding only (tests/cpu/interleaved_matmul_test.cpp).
#include "backends/cpu/avx512_intrinsics.h"

#include <cstdint>
#include <cstring>

#include "backends/cpu/kernels.h"
#include "core/blocks.h"
#include "core/dtype.h"

namespace tandem::cpu {
namespace {

// The row that lane L of a nibble gather holds (see the file comment): lane L is in qword L / 2
// of the vector, which holds the chunk's qword (L / 2) % 4, rows 4 ((L / 2) % 4) .. + 3; the low
// half takes the first two of them, the high half the last two.
constexpr int kNibbleLaneRow[16] = {0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15};
// Its inverse: the lane row r is in.
constexpr int kLaneOfRow[16] = {0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15};

constexpr bool inverse_of_each_other() {
  for (int lane = 0; lane < 16; ++lane)
    if (kLaneOfRow[kNibbleLaneRow[lane]] != lane) return false;
  return true;
}
static_assert(inverse_of_each_other());

inline __m512i rows_in_order(__m512i lanes) {
  const __m512i lane_of_row = _mm512_setr_epi32(
      kLaneOfRow[0], kLaneOfRow[1], kLaneOfRow[2], kLaneOfRow[3], kLaneOfRow[4], kLaneOfRow[5],
      kLaneOfRow[6], kLaneOfRow[7], kLaneOfRow[8], kLaneOfRow[9], kLaneOfRow[10], kLaneOfRow[11],
      kLaneOfRow[12], kLaneOfRow[13], kLaneOfRow[14], kLaneOfRow[15]);
  return _mm512_permutexvar_epi32(lane_of_row, lanes);
}

// A 64-byte control vector, filled at compile time (these files run no code at load time).
struct alignas(64) ByteVector {
  uint8_t bytes[64] = {};
  __m512i load() const { return _mm512_load_si512(bytes); }
};

// vpmultishiftqb's bit offsets for a nibble gather: lane L's byte k is bits [off, off + 8) of its
// qword, off = 16 m + (8 if k is odd) + (4 if k >= 2), m = the row's place in the qword; masked
// to 4 bits that is the low nibble of the row's byte k (k = 0, 1) or the high nibble of byte
// k - 2: columns 4c + k of the pair layout.
constexpr ByteVector nibble_offsets() {
  ByteVector v;
  for (int lane = 0; lane < 16; ++lane)
    for (int k = 0; k < 4; ++k)
      v.bytes[4 * lane + k] = uint8_t(16 * (kNibbleLaneRow[lane] % 4) + 8 * (k % 2) + 4 * (k / 2));
  return v;
}

// Where in qh[c][0] | qh[c][1] << 32 (Q5_0_R16's fifth bits, pair layout as lane masks) the
// fifth bit of lane L's byte k is: bit 2r + k of the low word for k = 0, 1, of the high word for
// k = 2, 3 (r = kNibbleLaneRow[L]).
constexpr ByteVector fifth_bit_offsets() {
  ByteVector v;
  for (int lane = 0; lane < 16; ++lane)
    for (int k = 0; k < 4; ++k)
      v.bytes[4 * lane + k] = uint8_t(32 * (k / 2) + 2 * kNibbleLaneRow[lane] + k % 2);
  return v;
}

// vpermb's index taking row r's bytes of two Q8_0_R16 chunks (pair layout) into lane r.
constexpr ByteVector rows_of_two_chunks() {
  ByteVector v;
  for (int r = 0; r < 16; ++r)
    for (int k = 0; k < 4; ++k) v.bytes[4 * r + k] = uint8_t(32 * (k / 2) + 2 * r + k % 2);
  return v;
}

constexpr ByteVector kNibbleOffsets = nibble_offsets();
constexpr ByteVector kFifthBitOffsets = fifth_bit_offsets();
constexpr ByteVector kRowsOfTwoChunks = rows_of_two_chunks();

// A chunk's 16 rows x its four columns (4c .. 4c + 3 of chunk c) as unsigned bytes, rows in
// kNibbleLaneRow order.
inline __m512i gather_nibbles(const uint8_t* chunk, __m512i offsets, __m512i low4) {
  const __m512i both = _mm512_broadcast_i64x4(load256(chunk));
  return _mm512_and_si512(_mm512_multishift_epi64_epi8(offsets, both), low4);
}

// Four activations broadcast to every lane: vpdpbusd's signed operand.
inline __m512i quad(const int8_t* x) {
  return broadcast_4_bytes(x);
}

// Q8_0_R16: per 32-column block, vpermb takes row r's bytes of chunks c and c + 1 (columns 2c ..
// 2c + 3) into lane r; the weights are made unsigned by flipping the sign bit (w + 128), and the
// accumulator starts at -128 Σx to take the offset back out. |sum| <= 32 * 255 * 127 < 2^31.
void group_dot_q8_0_q8(const void* w, const void* a, int64_t cols, float* out) {
  const auto* blocks = static_cast<const BlockQ8_0_R16*>(w);
  const auto* x = static_cast<const ActBlockQ8*>(a);
  const __m512i rows_of_two_chunks = kRowsOfTwoChunks.load();
  const __m512i sign_bit = _mm512_set1_epi8(char(0x80));
  __m512 acc = _mm512_setzero_ps();
  for (int64_t b = 0; b < cols / 32; ++b) {
    const BlockQ8_0_R16& block = blocks[b];
    prefetch_ahead(&block, sizeof(block));
    __m512i sum[2] = {_mm512_set1_epi32(-128 * x[b].sum), _mm512_setzero_si512()};
    for (int c = 0; c < 16; c += 2) {
      const __m512i two_chunks = _mm512_loadu_si512(block.qs + 32 * c);
      const __m512i q =
          _mm512_xor_si512(_mm512_permutexvar_epi8(rows_of_two_chunks, two_chunks), sign_bit);
      sum[c / 2 % 2] = _mm512_dpbusd_epi32(sum[c / 2 % 2], q, quad(x[b].qs + 2 * c));
    }
    const __m512 scale = _mm512_mul_ps(half_to_float(block.d), _mm512_set1_ps(x[b].d));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(sum[0], sum[1])), scale, acc);
  }
  _mm512_storeu_ps(out, acc);
}

// Q5_0_R16: the nibbles gathered as above with their fifth bits as byte masks (nibble + 16, 0 ..
// 31 unsigned), the accumulator started at -16 Σx for the format's offset. |sum| <= 32 * 31 * 127.
void group_dot_q5_0_q8(const void* w, const void* a, int64_t cols, float* out) {
  const auto* blocks = static_cast<const BlockQ5_0_R16*>(w);
  const auto* x = static_cast<const ActBlockQ8*>(a);
  const __m512i offsets = kNibbleOffsets.load(), bit_offsets = kFifthBitOffsets.load();
  const __m512i low4 = _mm512_set1_epi8(15), sixteen = _mm512_set1_epi8(16);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t b = 0; b < cols / 32; ++b) {
    const BlockQ5_0_R16& block = blocks[b];
    prefetch_ahead(&block, sizeof(block));
    __m512i sum[2] = {_mm512_set1_epi32(-16 * x[b].sum), _mm512_setzero_si512()};
    for (int c = 0; c < 8; ++c) {
      const __m512i nibbles = gather_nibbles(block.qs[c], offsets, low4);
      uint64_t high_bits;
      std::memcpy(&high_bits, block.qh[c], sizeof(high_bits));
      // vpshufbitqmb picks each byte's bit straight into the mask (a vpmultishiftqb and a
      // vptestmb before, the first on the pipe vpdpbusd needs: 12-15% of this kernel).
      const __mmask64 fifth =
          _mm512_bitshuffle_epi64_mask(_mm512_set1_epi64(int64_t(high_bits)), bit_offsets);
      sum[c % 2] =
          _mm512_dpbusd_epi32(sum[c % 2], _mm512_mask_add_epi8(nibbles, fifth, nibbles, sixteen),
                              quad(x[b].qs + 4 * c));
    }
    const __m512 scale = _mm512_mul_ps(half_to_float(block.d), _mm512_set1_ps(x[b].d));
    const __m512i total = rows_in_order(_mm512_add_epi32(sum[0], sum[1]));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), scale, acc);
  }
  _mm512_storeu_ps(out, acc);
}

// kNibbleLaneRow as bytes, for vpshufb: row-ordered bytes (one per row) put in lane order.
constexpr ByteVector lane_row_bytes() {
  ByteVector v;
  for (int lane = 0; lane < 16; ++lane) v.bytes[lane] = uint8_t(kNibbleLaneRow[lane]);
  return v;
}
constexpr ByteVector kLaneRowBytes = lane_row_bytes();

// Q4_K_R16 against BlockQ8_K: per sub-block j, the nibbles of its 8 chunks against the
// activations, multiplied by the sub-block's scales; per super-block
// out += float(Σ_j scale_j Σ q x) * (d * dx) - float(Σ_j min_j Σ_32 x) * (dmin * dx), as the plain
// kernel. |Σ_j scale_j Σ q x| <= 8 * 63 * 32 * 15 * 127 < 2^31.
//
// The sums stay in the gather's lane order (kNibbleLaneRow) to the end: the scales and d are
// brought to that order instead (one vpshufb of 16 bytes a sub-block, one vpermps a super-block),
// and the result is put in row order once. The mins are a vpmaddwd over two sub-blocks at a time
// (mins 0..63 against Σ_32 x, |Σ_32 x| <= 4096: both int16), not a vpmulld each: this core issues
// about two 512-bit operations a cycle, and vpmultishiftqb and vpdpbusd share one pipe, so every
// operation a sub-block spares shows (l2/Q4_K_R16/int8 in matmul_bench, same run: 8.42 -> 7.90 us).
void group_dot_q4_k_q8(const void* w, const void* a, int64_t cols, float* out) {
  const auto* blocks = static_cast<const BlockQ4_K_R16*>(w);
  const auto* x = static_cast<const BlockQ8_K*>(a);
  const __m512i offsets = kNibbleOffsets.load();
  const __m512i low4 = _mm512_set1_epi8(15);
  const __m128i lane_rows = _mm512_castsi512_si128(kLaneRowBytes.load());
  const __m512i row_of_lane = _mm512_cvtepu8_epi32(lane_rows);
  __m512 acc = _mm512_setzero_ps(), mins_acc = _mm512_setzero_ps();
  for (int64_t s = 0; s < cols / kQK_K; ++s) {
    const BlockQ4_K_R16& block = blocks[s];
    const BlockQ8_K& xs = x[s];
    __m512i scaled = _mm512_setzero_si512(), mins = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j) {
      // The whole block a sub-block at a time (its scales and mins too).
      prefetch_ahead(reinterpret_cast<const uint8_t*>(&block) + sizeof(block) / 8 * j,
                     sizeof(block) / 8);
      __m512i sum[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                        _mm512_setzero_si512()};
      for (int c = 0; c < 8; ++c)
        sum[c % 4] =
            _mm512_dpbusd_epi32(sum[c % 4], gather_nibbles(block.qs[j] + 32 * c, offsets, low4),
                                quad(xs.qs + 32 * j + 4 * c));
      const __m512i total =
          _mm512_add_epi32(_mm512_add_epi32(sum[0], sum[1]), _mm512_add_epi32(sum[2], sum[3]));
      const __m512i scales =
          _mm512_cvtepu8_epi32(_mm_shuffle_epi8(load128(block.scales[j]), lane_rows));
      scaled = _mm512_add_epi32(scaled, _mm512_mullo_epi32(total, scales));
    }
    for (int j = 0; j < 8; j += 2) {
      // Row r's int16 pair (min_j, min_j+1) against (Σ_32 x of j, of j + 1).
      const __m128i mins_j = load128(block.mins[j]), mins_next = load128(block.mins[j + 1]);
      const __m512i pairs = _mm512_cvtepu8_epi16(_mm256_set_m128i(
          _mm_unpackhi_epi8(mins_j, mins_next), _mm_unpacklo_epi8(mins_j, mins_next)));
      const int32_t x_sum = int32_t(xs.bsums[2 * j]) + int32_t(xs.bsums[2 * j + 1]);
      const int32_t x_sum_next = int32_t(xs.bsums[2 * j + 2]) + int32_t(xs.bsums[2 * j + 3]);
      const uint32_t both = uint32_t(uint16_t(x_sum)) | uint32_t(uint16_t(x_sum_next)) << 16;
      mins = _mm512_add_epi32(mins, _mm512_madd_epi16(pairs, _mm512_set1_epi32(int32_t(both))));
    }
    const __m512 dx = _mm512_set1_ps(xs.d);
    const __m512 d_lanes = _mm512_permutexvar_ps(row_of_lane, half_to_float(block.d));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(scaled), _mm512_mul_ps(d_lanes, dx), acc);
    mins_acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(mins),
                               _mm512_mul_ps(half_to_float(block.dmin), dx), mins_acc);
  }
  const __m512 rows = _mm512_castsi512_ps(rows_in_order(_mm512_castps_si512(acc)));
  _mm512_storeu_ps(out, _mm512_sub_ps(rows, mins_acc));
}

}  // namespace

void fill_avx512_group8_kernels(KernelTable& table) {
  table.group_dots8[size_t(DType::Q8_0)] = group_dot_q8_0_q8;
  table.group_dots8[size_t(DType::Q5_0)] = group_dot_q5_0_q8;
  table.group_dots8[size_t(DType::Q4_K)] = group_dot_q4_k_q8;
}

}  // namespace tandem::cpu

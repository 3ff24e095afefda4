// AVX-512 kernels of few_query_attention.h.
#include "backends/cpu/avx512_intrinsics.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "backends/cpu/kernels.h"

namespace tandem::cpu {
namespace {

// Columns past `cols` (a narrower last slice) are masked off: never read, never written. The
// accumulators are named one by one: with an array of them GCC 12 stored all sixteen to the
// stack on every row (a third of the speed).
template <int kQueries>
void sums(const float* const* p, const float* rows, int64_t row_stride, int64_t keys, int cols,
          float* const* out) {
  auto mask = [&](int v) { return __mmask16((uint32_t(1) << std::clamp(cols - 16 * v, 0, 16)) - 1); };
  const __mmask16 m0 = mask(0), m1 = mask(1), m2 = mask(2), m3 = mask(3);
  __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00,
         a13 = a00, a20 = a00, a21 = a00, a22 = a00, a23 = a00, a30 = a00, a31 = a00, a32 = a00, a33 = a00;
  for (int64_t j = 0; j < keys; ++j) {
    const float* row = rows + j * row_stride;
    const __m512 r0 = _mm512_maskz_loadu_ps(m0, row), r1 = _mm512_maskz_loadu_ps(m1, row + 16);
    const __m512 r2 = _mm512_maskz_loadu_ps(m2, row + 32), r3 = _mm512_maskz_loadu_ps(m3, row + 48);
    auto add = [&](int q, __m512& c0, __m512& c1, __m512& c2, __m512& c3) {
      const __m512 w = _mm512_set1_ps(p[q][j]);
      c0 = _mm512_fmadd_ps(w, r0, c0);
      c1 = _mm512_fmadd_ps(w, r1, c1);
      c2 = _mm512_fmadd_ps(w, r2, c2);
      c3 = _mm512_fmadd_ps(w, r3, c3);
    };
    add(0, a00, a01, a02, a03);
    if constexpr (kQueries > 1) add(1, a10, a11, a12, a13);
    if constexpr (kQueries > 2) add(2, a20, a21, a22, a23);
    if constexpr (kQueries > 3) add(3, a30, a31, a32, a33);
  }
  auto store = [&](int q, __m512 c0, __m512 c1, __m512 c2, __m512 c3) {
    _mm512_mask_storeu_ps(out[q], m0, c0);
    _mm512_mask_storeu_ps(out[q] + 16, m1, c1);
    _mm512_mask_storeu_ps(out[q] + 32, m2, c2);
    _mm512_mask_storeu_ps(out[q] + 48, m3, c3);
  };
  store(0, a00, a01, a02, a03);
  if constexpr (kQueries > 1) store(1, a10, a11, a12, a13);
  if constexpr (kQueries > 2) store(2, a20, a21, a22, a23);
  if constexpr (kQueries > 3) store(3, a30, a31, a32, a33);
}

// The next block of keys requested a cache line at a time while the current block is computed: a
// decode step's cache comes from DRAM (a layer's rows are read once a token), and sixteen rows
// 1-2 KiB apart, each read a few bytes a step, are more streams than the hardware prefetchers
// follow (attention_bench, 4096 keys over 27 layers' caches).
class NextKeysPrefetch {
 public:
  // `rows` rows of `row_bytes` bytes, `stride` bytes apart, from `first_row`.
  NextKeysPrefetch(const void* first_row, int64_t stride, int64_t row_bytes, int64_t rows)
      : row_(static_cast<const char*>(first_row)),
        stride_(stride),
        row_bytes_(row_bytes),
        rows_left_(rows) {}
  // One more line of the block (nothing once all of it is requested). A row that starts
  // mid-line or ends short of one shares its first or last line with a neighbour: that line may
  // go unrequested, which only costs its wait.
  void step() {
    if (rows_left_ <= 0) return;
    _mm_prefetch(row_ + offset_, _MM_HINT_T0);
    offset_ += 64;
    if (offset_ >= row_bytes_) {
      offset_ = 0;
      row_ += stride_;
      --rows_left_;
    }
  }

 private:
  const char* row_;
  int64_t stride_, row_bytes_, rows_left_;
  int64_t offset_ = 0;
};

// Up to 16 queries (transposed: column c's 16 floats at x_t + 16c) against n_keys keys: sixteen
// keys at a time in sixteen accumulators whose lanes are the queries (eight left this CPU's two
// FMA pipes waiting on their latency: 4096 keys 0.96 -> 0.72 ms a layer on 2 threads), then
// eight, then one; each key's 16 scores scattered to their rows. A key's lanes get the same
// arithmetic in every loop (one fma per column, in column order). The loops are written out: a
// template over an array of kKeys accumulators, fully unrolled, measured 15-20% slower.
void key_scores_16_avx512(const float* x_t, int n_queries, const float* keys, int64_t key_stride,
                          int64_t n_keys, int64_t cols, float* scores, int64_t score_stride) {
  const __mmask16 lanes = __mmask16((uint32_t(1) << n_queries) - 1);
  const __m512i rows = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                          _mm512_set1_epi32(int32_t(score_stride)));
  auto scatter = [&](int64_t j, __m512 acc) { _mm512_mask_i32scatter_ps(scores + j, lanes, rows, acc, 4); };
  int64_t j = 0;
  for (; j + 16 <= n_keys; j += 16) {
    const float* k = keys + j * key_stride;
    const int64_t s = key_stride;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    __m512 b0 = a0, b1 = a0, b2 = a0, b3 = a0, b4 = a0, b5 = a0, b6 = a0, b7 = a0;
    const float* l = k + 8 * s;
    // A row is cols * 4 bytes: 16 rows take cols lines, one a column.
    NextKeysPrefetch next(k + 16 * s, s * 4, cols * 4, std::min<int64_t>(16, n_keys - j - 16));
    for (int64_t c = 0; c < cols; ++c) {
      next.step();
      const __m512 x = _mm512_loadu_ps(x_t + 16 * c);
      a0 = _mm512_fmadd_ps(_mm512_set1_ps(k[c]), x, a0);
      a1 = _mm512_fmadd_ps(_mm512_set1_ps(k[s + c]), x, a1);
      a2 = _mm512_fmadd_ps(_mm512_set1_ps(k[2 * s + c]), x, a2);
      a3 = _mm512_fmadd_ps(_mm512_set1_ps(k[3 * s + c]), x, a3);
      a4 = _mm512_fmadd_ps(_mm512_set1_ps(k[4 * s + c]), x, a4);
      a5 = _mm512_fmadd_ps(_mm512_set1_ps(k[5 * s + c]), x, a5);
      a6 = _mm512_fmadd_ps(_mm512_set1_ps(k[6 * s + c]), x, a6);
      a7 = _mm512_fmadd_ps(_mm512_set1_ps(k[7 * s + c]), x, a7);
      b0 = _mm512_fmadd_ps(_mm512_set1_ps(l[c]), x, b0);
      b1 = _mm512_fmadd_ps(_mm512_set1_ps(l[s + c]), x, b1);
      b2 = _mm512_fmadd_ps(_mm512_set1_ps(l[2 * s + c]), x, b2);
      b3 = _mm512_fmadd_ps(_mm512_set1_ps(l[3 * s + c]), x, b3);
      b4 = _mm512_fmadd_ps(_mm512_set1_ps(l[4 * s + c]), x, b4);
      b5 = _mm512_fmadd_ps(_mm512_set1_ps(l[5 * s + c]), x, b5);
      b6 = _mm512_fmadd_ps(_mm512_set1_ps(l[6 * s + c]), x, b6);
      b7 = _mm512_fmadd_ps(_mm512_set1_ps(l[7 * s + c]), x, b7);
    }
    scatter(j, a0), scatter(j + 1, a1), scatter(j + 2, a2), scatter(j + 3, a3);
    scatter(j + 4, a4), scatter(j + 5, a5), scatter(j + 6, a6), scatter(j + 7, a7);
    scatter(j + 8, b0), scatter(j + 9, b1), scatter(j + 10, b2), scatter(j + 11, b3);
    scatter(j + 12, b4), scatter(j + 13, b5), scatter(j + 14, b6), scatter(j + 15, b7);
  }
  for (; j + 8 <= n_keys; j += 8) {
    const float* k = keys + j * key_stride;
    const int64_t s = key_stride;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (int64_t c = 0; c < cols; ++c) {
      const __m512 x = _mm512_loadu_ps(x_t + 16 * c);
      a0 = _mm512_fmadd_ps(_mm512_set1_ps(k[c]), x, a0);
      a1 = _mm512_fmadd_ps(_mm512_set1_ps(k[s + c]), x, a1);
      a2 = _mm512_fmadd_ps(_mm512_set1_ps(k[2 * s + c]), x, a2);
      a3 = _mm512_fmadd_ps(_mm512_set1_ps(k[3 * s + c]), x, a3);
      a4 = _mm512_fmadd_ps(_mm512_set1_ps(k[4 * s + c]), x, a4);
      a5 = _mm512_fmadd_ps(_mm512_set1_ps(k[5 * s + c]), x, a5);
      a6 = _mm512_fmadd_ps(_mm512_set1_ps(k[6 * s + c]), x, a6);
      a7 = _mm512_fmadd_ps(_mm512_set1_ps(k[7 * s + c]), x, a7);
    }
    scatter(j, a0), scatter(j + 1, a1), scatter(j + 2, a2), scatter(j + 3, a3);
    scatter(j + 4, a4), scatter(j + 5, a5), scatter(j + 6, a6), scatter(j + 7, a7);
  }
  for (; j < n_keys; ++j) {
    const float* k = keys + j * key_stride;
    __m512 a = _mm512_setzero_ps();
    for (int64_t c = 0; c < cols; ++c) a = _mm512_fmadd_ps(_mm512_set1_ps(k[c]), _mm512_loadu_ps(x_t + 16 * c), a);
    scatter(j, a);
  }
}

// kernels.h's bf16 key scores: the f32 loop above with a pair of columns per step (vdpbf16ps:
// 32 products an instruction, against 16 for an fma), each key's pair broadcast as one dword.
__m512bh bf16_pair(const uint16_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return (__m512bh)_mm512_set1_epi32(v);
}

// acc += x · the pair at p broadcast to every lane, the broadcast done by the load (vdpbf16ps's
// {1to16} memory operand). GCC 12 does not fold _mm512_set1_epi32 into vdpbf16ps as it does into
// vfmadd231ps, and the separate vpbroadcastd set the pace (attention_bench, 4096 keys: 0.62 ->
// 0.58 ms a layer; docs/performance.md).
inline __m512 dp_pair(__m512 acc, __m512bh x, const uint16_t* p) {
  asm("vdpbf16ps %2%{1to16%}, %1, %0"
      : "+v"(acc)
      : "v"(x), "m"(*reinterpret_cast<const int32_t*>(p)));
  return acc;
}

void key_scores_16_bf16_avx512(const uint16_t* x_p, int n_queries, const uint16_t* keys,
                               int64_t key_stride, int64_t n_keys, int64_t cols, float* scores,
                               int64_t score_stride) {
  const __mmask16 lanes = __mmask16((uint32_t(1) << n_queries) - 1);
  const __m512i rows =
      _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                         _mm512_set1_epi32(int32_t(score_stride)));
  auto scatter = [&](int64_t j, __m512 acc) {
    _mm512_mask_i32scatter_ps(scores + j, lanes, rows, acc, 4);
  };
  auto queries = [&](int64_t c) { return (__m512bh)_mm512_loadu_si512(x_p + 16 * c); };
  const int64_t s = key_stride;
  int64_t j = 0;
  for (; j + 16 <= n_keys; j += 16) {
    const uint16_t* k = keys + j * s;
    const uint16_t* l = k + 8 * s;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    __m512 b0 = a0, b1 = a0, b2 = a0, b3 = a0, b4 = a0, b5 = a0, b6 = a0, b7 = a0;
    // Two pairs a step: one pointer increment per row for 32 products (GCC keeps a pointer per
    // row), then an odd last pair.
    auto pair_step = [&](int64_t c) {
      const __m512bh x = queries(c);
      a0 = dp_pair(a0, x, k + c);
      a1 = dp_pair(a1, x, k + s + c);
      a2 = dp_pair(a2, x, k + 2 * s + c);
      a3 = dp_pair(a3, x, k + 3 * s + c);
      a4 = dp_pair(a4, x, k + 4 * s + c);
      a5 = dp_pair(a5, x, k + 5 * s + c);
      a6 = dp_pair(a6, x, k + 6 * s + c);
      a7 = dp_pair(a7, x, k + 7 * s + c);
      b0 = dp_pair(b0, x, l + c);
      b1 = dp_pair(b1, x, l + s + c);
      b2 = dp_pair(b2, x, l + 2 * s + c);
      b3 = dp_pair(b3, x, l + 3 * s + c);
      b4 = dp_pair(b4, x, l + 4 * s + c);
      b5 = dp_pair(b5, x, l + 5 * s + c);
      b6 = dp_pair(b6, x, l + 6 * s + c);
      b7 = dp_pair(b7, x, l + 7 * s + c);
    };
    // A row is cols * 2 bytes: 16 rows take cols / 2 lines, one per two columns.
    NextKeysPrefetch next(k + 16 * s, s * 2, cols * 2, std::min<int64_t>(16, n_keys - j - 16));
    int64_t c = 0;
    for (; c + 4 <= cols; c += 4) {
      next.step();
      pair_step(c);
      next.step();
      pair_step(c + 2);
    }
    if (c < cols) pair_step(c);
    scatter(j, a0), scatter(j + 1, a1), scatter(j + 2, a2), scatter(j + 3, a3);
    scatter(j + 4, a4), scatter(j + 5, a5), scatter(j + 6, a6), scatter(j + 7, a7);
    scatter(j + 8, b0), scatter(j + 9, b1), scatter(j + 10, b2), scatter(j + 11, b3);
    scatter(j + 12, b4), scatter(j + 13, b5), scatter(j + 14, b6), scatter(j + 15, b7);
  }
  for (; j + 4 <= n_keys; j += 4) {
    const uint16_t* k = keys + j * s;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t c = 0; c < cols; c += 2) {
      const __m512bh x = queries(c);
      a0 = _mm512_dpbf16_ps(a0, x, bf16_pair(k + c));
      a1 = _mm512_dpbf16_ps(a1, x, bf16_pair(k + s + c));
      a2 = _mm512_dpbf16_ps(a2, x, bf16_pair(k + 2 * s + c));
      a3 = _mm512_dpbf16_ps(a3, x, bf16_pair(k + 3 * s + c));
    }
    scatter(j, a0), scatter(j + 1, a1), scatter(j + 2, a2), scatter(j + 3, a3);
  }
  for (; j < n_keys; ++j) {
    const uint16_t* k = keys + j * s;
    __m512 a = _mm512_setzero_ps();
    for (int64_t c = 0; c < cols; c += 2) a = _mm512_dpbf16_ps(a, queries(c), bf16_pair(k + c));
    scatter(j, a);
  }
}

// kernels.h's bf16 weighted sums: keys j and j + 1 interleaved word by word (vpunpck{l,h}wd, which
// works within 128-bit lanes: accumulator element 4l + m holds column 8l + m of the low unpack,
// 8l + 4 + m of the high one), each query's two weights broadcast as one dword; the columns are put
// back in order once, at the end. Accumulators named one by one, as in sums().
template <int kQueries>
void sums_bf16(const uint16_t* const* p, const uint16_t* rows, int64_t row_stride, int64_t keys,
               int cols, float* const* out) {
  auto words = [&](int v) {
    return __mmask32((uint64_t(1) << std::clamp(cols - 32 * v, 0, 32)) - 1);
  };
  const __mmask32 m0 = words(0), m1 = words(1);
  __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00,
         a12 = a00, a13 = a00, a20 = a00, a21 = a00, a22 = a00, a23 = a00, a30 = a00, a31 = a00,
         a32 = a00, a33 = a00;
  auto step = [&](__m512i r0, __m512i r1, __m512i s0, __m512i s1, auto weights) {
    const __m512bh lo0 = (__m512bh)_mm512_unpacklo_epi16(r0, s0),
                   hi0 = (__m512bh)_mm512_unpackhi_epi16(r0, s0);
    const __m512bh lo1 = (__m512bh)_mm512_unpacklo_epi16(r1, s1),
                   hi1 = (__m512bh)_mm512_unpackhi_epi16(r1, s1);
    auto add = [&](int q, __m512& c0, __m512& c1, __m512& c2, __m512& c3) {
      const __m512bh w = weights(q);
      c0 = _mm512_dpbf16_ps(c0, lo0, w);
      c1 = _mm512_dpbf16_ps(c1, hi0, w);
      c2 = _mm512_dpbf16_ps(c2, lo1, w);
      c3 = _mm512_dpbf16_ps(c3, hi1, w);
    };
    add(0, a00, a01, a02, a03);
    if constexpr (kQueries > 1) add(1, a10, a11, a12, a13);
    if constexpr (kQueries > 2) add(2, a20, a21, a22, a23);
    if constexpr (kQueries > 3) add(3, a30, a31, a32, a33);
  };
  int64_t j = 0;
  for (; j + 2 <= keys; j += 2) {
    const uint16_t* r = rows + j * row_stride;
    const uint16_t* n = r + row_stride;
    step(_mm512_maskz_loadu_epi16(m0, r), _mm512_maskz_loadu_epi16(m1, r + 32),
         _mm512_maskz_loadu_epi16(m0, n), _mm512_maskz_loadu_epi16(m1, n + 32),
         [&](int q) { return bf16_pair(p[q] + j); });
  }
  if (j < keys) {  // an odd last key, its partner zero (the word after its weight is not read)
    const uint16_t* r = rows + j * row_stride;
    const __m512i zero = _mm512_setzero_si512();
    step(_mm512_maskz_loadu_epi16(m0, r), _mm512_maskz_loadu_epi16(m1, r + 32), zero, zero,
         [&](int q) { return (__m512bh)_mm512_set1_epi32(int32_t(p[q][j])); });
  }
  const __m512i first = _mm512_set_epi32(23, 22, 21, 20, 7, 6, 5, 4, 19, 18, 17, 16, 3, 2, 1, 0);
  const __m512i second =
      _mm512_set_epi32(31, 30, 29, 28, 15, 14, 13, 12, 27, 26, 25, 24, 11, 10, 9, 8);
  auto mask = [&](int v) {
    return __mmask16((uint32_t(1) << std::clamp(cols - 16 * v, 0, 16)) - 1);
  };
  auto store = [&](int q, __m512 lo0, __m512 hi0, __m512 lo1, __m512 hi1) {
    _mm512_mask_storeu_ps(out[q], mask(0), _mm512_permutex2var_ps(lo0, first, hi0));
    _mm512_mask_storeu_ps(out[q] + 16, mask(1), _mm512_permutex2var_ps(lo0, second, hi0));
    _mm512_mask_storeu_ps(out[q] + 32, mask(2), _mm512_permutex2var_ps(lo1, first, hi1));
    _mm512_mask_storeu_ps(out[q] + 48, mask(3), _mm512_permutex2var_ps(lo1, second, hi1));
  };
  store(0, a00, a01, a02, a03);
  if constexpr (kQueries > 1) store(1, a10, a11, a12, a13);
  if constexpr (kQueries > 2) store(2, a20, a21, a22, a23);
  if constexpr (kQueries > 3) store(3, a30, a31, a32, a33);
}

void weighted_sums_64_bf16_avx512(const uint16_t* const* p, int n_queries, const uint16_t* rows,
                                  int64_t row_stride, int64_t keys, int cols, float* const* out) {
  switch (n_queries) {
    case 1:
      return sums_bf16<1>(p, rows, row_stride, keys, cols, out);
    case 2:
      return sums_bf16<2>(p, rows, row_stride, keys, cols, out);
    case 3:
      return sums_bf16<3>(p, rows, row_stride, keys, cols, out);
    default:
      return sums_bf16<4>(p, rows, row_stride, keys, cols, out);
  }
}

// f32_to_bf16 (core/half.h) of 16 floats: round to nearest even, a NaN kept quiet. Not
// vcvtneps2bf16, which treats denormal inputs as zeros: tiny softmax weights would round
// differently from the portable level's.
__m256i f32_to_bf16_x16(__m512 v) {
  const __m512i x = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(x, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}

float softmax_block_avx512(float* s, int64_t n, float scale, float* top, uint16_t* weights16) {
  const __m512 scale_v = _mm512_set1_ps(scale);
  auto mask = [&](int64_t j) {
    return __mmask16((uint32_t(1) << std::min<int64_t>(16, n - j)) - 1);
  };
  __m512 t = _mm512_set1_ps(*top);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = mask(j);
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, s + j), scale_v);
    _mm512_mask_storeu_ps(s + j, m, v);
    t = _mm512_mask_max_ps(t, m, t, v);
  }
  const float new_top = _mm512_reduce_max_ps(t);
  const __m512 top_v = _mm512_set1_ps(new_top);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = mask(j);
    const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + j), top_v));
    _mm512_mask_storeu_ps(s + j, m, e);
    if (weights16) _mm256_mask_storeu_epi16(weights16 + j, m, f32_to_bf16_x16(e));
    sum = _mm512_mask_add_ps(sum, m, sum, e);
  }
  *top = new_top;
  return _mm512_reduce_add_ps(sum);
}

// The multiply and the add rounded apart (the _round_ forms are never contracted into an fma), as
// the portable level does.
void scale_add_avx512(float* out, const float* in, float scale, int64_t n) {
  constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const __m512 scale_v = _mm512_set1_ps(scale);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = __mmask16((uint32_t(1) << std::min<int64_t>(16, n - i)) - 1);
    const __m512 scaled = _mm512_mul_round_ps(_mm512_maskz_loadu_ps(m, out + i), scale_v, kNearest);
    _mm512_mask_storeu_ps(out + i, m,
                          _mm512_add_round_ps(scaled, _mm512_maskz_loadu_ps(m, in + i), kNearest));
  }
}

void weighted_sums_64_avx512(const float* const* p, int n_queries, const float* rows, int64_t row_stride,
                             int64_t keys, int cols, float* const* out) {
  switch (n_queries) {
    case 1: return sums<1>(p, rows, row_stride, keys, cols, out);
    case 2: return sums<2>(p, rows, row_stride, keys, cols, out);
    case 3: return sums<3>(p, rows, row_stride, keys, cols, out);
    default: return sums<4>(p, rows, row_stride, keys, cols, out);
  }
}

}  // namespace

void fill_avx512_few_query_attention(KernelTable& table) {
  table.key_scores_16 = key_scores_16_avx512;
  table.weighted_sums_64 = weighted_sums_64_avx512;
  table.softmax_block = softmax_block_avx512;
  table.scale_add = scale_add_avx512;
  table.key_scores_16_bf16 = key_scores_16_bf16_avx512;
  table.weighted_sums_64_bf16 = weighted_sums_64_bf16_avx512;
}

}  // namespace tandem::cpu

// AVX-512 kernels of few_query_attention.h.
#include "backends/cpu/avx512_intrinsics.h"

#include <algorithm>
#include <cstdint>

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

float softmax_block_avx512(float* s, int64_t n, float scale, float* top) {
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
    sum = _mm512_mask_add_ps(sum, m, sum, e);
  }
  *top = new_top;
  return _mm512_reduce_add_ps(sum);
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
}

}  // namespace tandem::cpu

#include "backends/cpu/few_query_attention.h"

#include <algorithm>
#include <vector>

#include "backends/cpu/kernels.h"
#include "core/error.h"

namespace tandem::cpu {
namespace {

// Keys per task: enough that a task's work dwarfs claiming it.
constexpr int64_t kKeysPerTask = 64;

void run_key_scores(const KernelTable& table, const KeyScoresArgs& a, ThreadPool& pool) {
  TANDEM_CHECK(a.cols >= 0 && a.cols <= a.key_stride && a.cols <= a.x_stride && a.n_keys >= 0 &&
               a.n_queries >= 0 && a.n_keys <= a.score_stride);
  // Groups of 16 queries, transposed: group g's column c is the 16 floats at
  // transposed[(g * cols + c) * 16] (missing queries of the last group are zeros).
  const int64_t n_groups = (a.n_queries + 15) / 16;
  thread_local std::vector<float> transposed_storage;
  std::vector<float>& transposed = transposed_storage;  // named here: workers see the caller's
  transposed.assign(size_t(n_groups * a.cols * 16), 0.0f);
  for (int64_t q = 0; q < a.n_queries; ++q)
    for (int64_t c = 0; c < a.cols; ++c)
      transposed[size_t(((q / 16) * a.cols + c) * 16 + q % 16)] = a.x[q * a.x_stride + c];
  const int64_t n_tasks = (a.n_keys + kKeysPerTask - 1) / kKeysPerTask;
  pool.parallel_for(n_tasks * n_groups, [&](int64_t task, int) {
    const int64_t g = task % n_groups, first = (task / n_groups) * kKeysPerTask;
    table.key_scores_16(transposed.data() + g * a.cols * 16, int(std::min<int64_t>(16, a.n_queries - 16 * g)),
                        a.keys + first * a.key_stride, a.key_stride, std::min(kKeysPerTask, a.n_keys - first),
                        a.cols, a.scores + 16 * g * a.score_stride + first, a.score_stride);
  });
}

void run_weighted_sums(const KernelTable& table, const WeightedSumsArgs& a, ThreadPool& pool) {
  TANDEM_CHECK(a.n >= 0 && a.n <= a.row_stride && a.keys >= 0 && a.n_queries >= 0);
  const int64_t n_slices = (a.n + 63) / 64;
  pool.parallel_for(n_slices, [&](int64_t slice, int) {
    for (int64_t q0 = 0; q0 < a.n_queries; q0 += 4) {
      const int n_q = int(std::min<int64_t>(4, a.n_queries - q0));
      const float* p[4];
      float* out[4];
      for (int q = 0; q < n_q; ++q) {
        p[q] = a.p + (q0 + q) * a.p_stride;
        out[q] = a.out + (q0 + q) * a.out_stride + 64 * slice;
      }
      table.weighted_sums_64(p, n_q, a.rows + 64 * slice, a.row_stride, a.keys,
                             int(std::min<int64_t>(64, a.n - 64 * slice)), out);
    }
  });
}

}  // namespace

void key_scores_16_portable(const float* x_t, int n_queries, const float* keys, int64_t key_stride,
                            int64_t n_keys, int64_t cols, float* scores, int64_t score_stride) {
  for (int64_t j = 0; j < n_keys; ++j) {
    float acc[16] = {};
    const float* key = keys + j * key_stride;
    for (int64_t c = 0; c < cols; ++c)
      for (int q = 0; q < 16; ++q) acc[q] += key[c] * x_t[c * 16 + q];
    for (int q = 0; q < n_queries; ++q) scores[q * score_stride + j] = acc[q];
  }
}

void weighted_sums_64_portable(const float* const* p, int n_queries, const float* rows,
                               int64_t row_stride, int64_t keys, int cols, float* const* out) {
  for (int q = 0; q < n_queries; ++q) std::fill(out[q], out[q] + cols, 0.0f);
  for (int64_t j = 0; j < keys; ++j) {
    const float* row = rows + j * row_stride;
    for (int q = 0; q < n_queries; ++q) {
      const float w = p[q][j];
      for (int c = 0; c < cols; ++c) out[q][c] += w * row[c];
    }
  }
}

void key_scores(const KeyScoresArgs& args, ThreadPool& pool) {
  run_key_scores(best_kernel_table(), args, pool);
}

void weighted_sums(const WeightedSumsArgs& args, ThreadPool& pool) {
  run_weighted_sums(best_kernel_table(), args, pool);
}

void key_scores_with_isa(CpuIsa isa, const KeyScoresArgs& args, ThreadPool& pool) {
  run_key_scores(kernel_table(isa), args, pool);
}

void weighted_sums_with_isa(CpuIsa isa, const WeightedSumsArgs& args, ThreadPool& pool) {
  run_weighted_sums(kernel_table(isa), args, pool);
}

}  // namespace tandem::cpu

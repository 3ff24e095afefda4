#include "backends/cpu/few_query_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backends/cpu/kernels.h"
#include "core/error.h"
#include "core/half.h"

namespace tandem::cpu {
namespace {

// Keys per task: enough that a task's work dwarfs claiming it.
constexpr int64_t kKeysPerTask = 64;

// Queries in groups of 16, transposed for key_scores_16: group g's column c is the 16 floats at
// out[(g * cols + c) * 16] (missing queries of the last group are zeros).
void transpose_queries(const float* x, int64_t x_stride, int64_t n_queries, int64_t cols,
                       std::vector<float>& out) {
  out.assign(size_t((n_queries + 15) / 16 * cols * 16), 0.0f);
  for (int64_t q = 0; q < n_queries; ++q)
    for (int64_t c = 0; c < cols; ++c) out[size_t(((q / 16) * cols + c) * 16 + q % 16)] = x[q * x_stride + c];
}

// The same rounded to bf16, for key_scores_16_bf16: group g's columns 2i and 2i + 1 of query q at
// out[(g * cols + 32 i) + 2 q] and the next (cols even).
void transpose_queries_bf16(const float* x, int64_t x_stride, int64_t n_queries, int64_t cols,
                            std::vector<uint16_t>& out) {
  out.assign(size_t((n_queries + 15) / 16 * cols * 16), 0);
  for (int64_t q = 0; q < n_queries; ++q)
    for (int64_t c = 0; c < cols; ++c)
      out[size_t((q / 16) * cols * 16 + (c / 2) * 32 + (q % 16) * 2 + c % 2)] =
          f32_to_bf16(x[q * x_stride + c]);
}

void run_key_scores(const KernelTable& table, const KeyScoresArgs& a, ThreadPool& pool) {
  TANDEM_CHECK(a.cols >= 0 && a.cols <= a.key_stride && a.cols <= a.x_stride && a.n_keys >= 0 &&
               a.n_queries >= 0 && a.n_keys <= a.score_stride);
  const int64_t n_groups = (a.n_queries + 15) / 16;
  thread_local std::vector<float> transposed_storage;
  std::vector<float>& transposed = transposed_storage;  // named here: workers see the caller's
  transpose_queries(a.x, a.x_stride, a.n_queries, a.cols, transposed);
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

// What one part of one token's keys (part_keys of them at most) leaves for the merge: per
// head the largest scaled score, the sum of the exponentials against it, and the rows' sum
// weighted by them.
struct Part {
  float* max = nullptr;  // [heads]
  float* sum = nullptr;  // [heads]
  float* acc = nullptr;  // [heads, n_out]
};

// Keys per part (a task's work, its blocks merged as it goes): one block up to 1024 keys, so
// that a short context still gives the threads several tasks; 512 keys beyond (with 128-key
// blocks, 512-key parts measured faster at 4096 keys than 128-key ones: 0.77 against 0.83-0.91 ms
// a layer; a token at 4096 keys then has eight tasks for the threads, where 1024-key parts would
// leave four), which also keeps the parts held for the final merge small however long the
// context. It depends on the token's own key count only, so a token's result still does not
// depend on its call mates.
int64_t part_keys(int64_t n_keys) {
  return n_keys <= 1024 ? kAttendBlock : 512;
}

void run_attend(const KernelTable& table, const AttendArgs& a, ThreadPool& pool) {
  const int64_t groups = a.kv_groups;
  TANDEM_CHECK(a.cols >= 0 && a.n_tokens >= 0 && a.heads >= 0 && groups >= 1 &&
               a.heads % groups == 0 && a.ring >= 0);
  TANDEM_CHECK(a.values ? a.n_out <= a.value_stride : a.n_out <= a.cols);
  TANDEM_CHECK((groups - 1) * a.key_group_offset + a.cols <= a.key_stride && a.cols <= a.x_stride);
  const bool bf16 = a.cache_type == DType::BF16;
  TANDEM_CHECK(a.cache_type == DType::F32 || (bf16 && a.cols % 2 == 0));
  if (a.n_tokens == 0 || a.heads == 0) return;
  const int64_t H = a.heads, per_group = H / groups;
  const int64_t vector_groups = (per_group + 15) / 16, n_slices = (a.n_out + 63) / 64;
  const void* value_rows = a.values ? a.values : a.keys;
  const int64_t value_stride = a.values ? a.value_stride : a.key_stride;
  // Value `at` of rows held as cache_type.
  auto f32_at = [](const void* rows, int64_t at) { return static_cast<const float*>(rows) + at; };
  auto bf16_at = [](const void* rows, int64_t at) {
    return static_cast<const uint16_t*>(rows) + at;
  };
  auto first_key = [&](int64_t t) -> int64_t { return a.first_key ? a.first_key[t] : 0; };
  // Parts per token, and where each token's parts start in the list.
  thread_local std::vector<int64_t> first_part_storage;
  std::vector<int64_t>& first_part = first_part_storage;  // named here: workers see the caller's
  first_part.assign(size_t(a.n_tokens + 1), 0);
  for (int64_t t = 0; t < a.n_tokens; ++t) {
    TANDEM_CHECK(a.last_key[t] >= first_key(t) && first_key(t) >= 0);
    TANDEM_CHECK(a.ring == 0 || a.last_key[t] - first_key(t) < a.ring);
    const int64_t keys = a.last_key[t] - first_key(t) + 1;
    first_part[size_t(t + 1)] = first_part[size_t(t)] + (keys + part_keys(keys) - 1) / part_keys(keys);
  }
  const int64_t n_parts = first_part.back();
  const size_t part_floats = size_t(H * (2 + a.n_out));
  thread_local std::vector<float> parts_storage;
  std::vector<float>& parts = parts_storage;
  if (parts.size() < size_t(n_parts) * part_floats) parts.resize(size_t(n_parts) * part_floats);
  auto part = [&](int64_t i) {
    float* base = parts.data() + size_t(i) * part_floats;
    return Part{.max = base, .sum = base + H, .acc = base + 2 * H};
  };

  // Every token's queries transposed once (per kv group; bf16 for a bf16 cache), before its
  // parts: a token at 4096 keys has eight, and transposing in each cost 5% of its attention.
  const size_t group_floats = size_t(vector_groups * a.cols * 16);
  const size_t token_floats = size_t(groups) * group_floats;
  thread_local std::vector<float> transposed_storage;
  thread_local std::vector<uint16_t> transposed16_storage;
  std::vector<float>& transposed = transposed_storage;  // named here: workers see the caller's
  std::vector<uint16_t>& transposed16 = transposed16_storage;
  if (bf16)
    transposed16.resize(size_t(a.n_tokens) * token_floats);
  else
    transposed.resize(size_t(a.n_tokens) * token_floats);
  pool.parallel_for(a.n_tokens * groups, [&](int64_t task, int) {
    const int64_t t = task / groups, g = task % groups;
    const float* x = a.x + (t * H + g * per_group) * a.x_stride;
    const size_t at = size_t(t) * token_floats + size_t(g) * group_floats;
    thread_local std::vector<float> one_group;
    thread_local std::vector<uint16_t> one_group16;
    if (bf16) {
      transpose_queries_bf16(x, a.x_stride, per_group, a.cols, one_group16);
      std::copy(one_group16.begin(), one_group16.end(), transposed16.begin() + at);
    } else {
      transpose_queries(x, a.x_stride, per_group, a.cols, one_group);
      std::copy(one_group.begin(), one_group.end(), transposed.begin() + at);
    }
  });

  pool.parallel_for(n_parts, [&](int64_t i, int) {
    const int64_t t = std::upper_bound(first_part.begin(), first_part.end(), i) - first_part.begin() - 1;
    const int64_t keys = a.last_key[t] - first_key(t) + 1, part_size = part_keys(keys);
    const int64_t part_first = first_key(t) + (i - first_part[size_t(t)]) * part_size;
    const int64_t part_end = std::min(part_first + part_size, a.last_key[t] + int64_t(1));
    // Each thread's own scratch: a block's scores (and their bf16 weights, a zero after an odd
    // count) and weighted sums, and how much the sums before it shrink.
    thread_local std::vector<float> scores, block_acc, old_scale;
    thread_local std::vector<uint16_t> weights16;
    scores.resize(size_t(H * kAttendBlock));
    if (bf16) weights16.resize(size_t(H * (kAttendBlock + 1)));
    block_acc.resize(size_t(H * a.n_out));
    old_scale.resize(size_t(H));
    const Part out = part(i);
    for (int64_t first = part_first; first < part_end;) {
      int64_t n_keys = std::min(kAttendBlock, part_end - first);
      const int64_t row = a.ring ? first % a.ring : first;
      if (a.ring) n_keys = std::min(n_keys, a.ring - row);  // a block's rows are consecutive
      const bool first_block = first == part_first;
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t key_at = row * a.key_stride + g * a.key_group_offset;
        for (int64_t v = 0; v < vector_groups; ++v) {
          const int64_t head = g * per_group + 16 * v;
          const size_t x_at =
              size_t(t) * token_floats + size_t(g) * group_floats + size_t(v * a.cols * 16);
          const int n_queries = int(std::min<int64_t>(16, per_group - 16 * v));
          float* head_scores = scores.data() + head * kAttendBlock;
          if (bf16)
            table.key_scores_16_bf16(transposed16.data() + x_at, n_queries, bf16_at(a.keys, key_at),
                                     a.key_stride, n_keys, a.cols, head_scores, kAttendBlock);
          else
            table.key_scores_16(transposed.data() + x_at, n_queries, f32_at(a.keys, key_at),
                                a.key_stride, n_keys, a.cols, head_scores, kAttendBlock);
        }
      }
      // Exponentials against the largest score so far; what the earlier blocks summed is scaled
      // down when this block raised it (by exactly 1 when it did not).
      for (int64_t h = 0; h < H; ++h) {
        float top = first_block ? -INFINITY : out.max[h];
        // bf16: the weights as the bf16 sums take them (the sum is of the F32 ones).
        uint16_t* w = bf16 ? weights16.data() + h * (kAttendBlock + 1) : nullptr;
        const float sum =
            table.softmax_block(scores.data() + h * kAttendBlock, n_keys, a.scale, &top, w);
        if (w) w[n_keys] = 0;
        old_scale[h] = first_block ? 0.0f : std::exp(out.max[h] - top);
        out.sum[h] = first_block ? sum : out.sum[h] * old_scale[h] + sum;
        out.max[h] = top;
      }
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t rows_at = row * value_stride + g * a.value_group_offset;
        for (int64_t slice = 0; slice < n_slices; ++slice)
          for (int64_t q0 = g * per_group; q0 < (g + 1) * per_group; q0 += 4) {
            const int n_q = int(std::min<int64_t>(4, (g + 1) * per_group - q0));
            const int cols = int(std::min<int64_t>(64, a.n_out - 64 * slice));
            const float* p[4];
            const uint16_t* p16[4] = {};
            float* acc[4];
            for (int q = 0; q < n_q; ++q) {
              p[q] = scores.data() + (q0 + q) * kAttendBlock;
              if (bf16) p16[q] = weights16.data() + (q0 + q) * (kAttendBlock + 1);
              acc[q] = (first_block ? out.acc : block_acc.data()) + (q0 + q) * a.n_out + 64 * slice;
            }
            if (bf16)
              table.weighted_sums_64_bf16(p16, n_q, bf16_at(value_rows, rows_at + 64 * slice),
                                          value_stride, n_keys, cols, acc);
            else
              table.weighted_sums_64(p, n_q, f32_at(value_rows, rows_at + 64 * slice), value_stride,
                                     n_keys, cols, acc);
          }
      }
      if (!first_block)
        for (int64_t h = 0; h < H; ++h)
          table.scale_add(out.acc + h * a.n_out, block_acc.data() + h * a.n_out, old_scale[h],
                          a.n_out);
      first += n_keys;
    }
  });

  // Each (token, head): its parts rescaled to the largest maximum (the sink's logit among them)
  // and added in order; the sink adds to the denominator only.
  pool.parallel_for(a.n_tokens * H, [&](int64_t query, int) {
    const int64_t t = query / H, h = query % H;
    const int64_t first = first_part[size_t(t)], last = first_part[size_t(t + 1)];
    float top = a.sinks ? a.sinks[h] : -INFINITY;
    for (int64_t i = first; i < last; ++i) top = std::max(top, part(i).max[h]);
    float total = 0;
    for (int64_t i = first; i < last; ++i) total += part(i).sum[h] * std::exp(part(i).max[h] - top);
    if (a.sinks) total += std::exp(a.sinks[h] - top);
    float* o = a.out + t * a.out_token_stride + h * a.out_head_stride;
    std::fill(o, o + a.n_out, 0.0f);
    for (int64_t i = first; i < last; ++i) {
      const float w = std::exp(part(i).max[h] - top) / total;
      const float* acc = part(i).acc + h * a.n_out;
      for (int64_t c = 0; c < a.n_out; ++c) o[c] += w * acc[c];
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

// GCC 12.2 at -O3 vectorizes this loop wrongly (a score of -0.75 for 0.30 with 24 columns; -O2,
// or -O3 without the loop vectorizer, compute it right): the vectorizer is off for it.
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-tree-loop-vectorize")))
#endif
void key_scores_16_bf16_portable(const uint16_t* x_p, int n_queries, const uint16_t* keys,
                                 int64_t key_stride, int64_t n_keys, int64_t cols, float* scores,
                                 int64_t score_stride) {
  for (int64_t j = 0; j < n_keys; ++j) {
    const uint16_t* key = keys + j * key_stride;
    for (int q = 0; q < n_queries; ++q) {
      float acc = 0;
      for (int64_t c = 0; c < cols; c += 2) {
        const uint16_t* x = x_p + c * 16 + 2 * q;
        acc += bf16_to_f32(x[1]) * bf16_to_f32(key[c + 1]);  // exact products: 8-bit significands
        acc += bf16_to_f32(x[0]) * bf16_to_f32(key[c]);
      }
      scores[q * score_stride + j] = acc;
    }
  }
}

void weighted_sums_64_bf16_portable(const uint16_t* const* p, int n_queries, const uint16_t* rows,
                                    int64_t row_stride, int64_t keys, int cols, float* const* out) {
  for (int q = 0; q < n_queries; ++q)
    for (int c = 0; c < cols; ++c) {
      float acc = 0;
      for (int64_t j = 0; j < keys; j += 2) {
        if (j + 1 < keys)
          acc += bf16_to_f32(p[q][j + 1]) * bf16_to_f32(rows[(j + 1) * row_stride + c]);
        acc += bf16_to_f32(p[q][j]) * bf16_to_f32(rows[j * row_stride + c]);
      }
      out[q][c] = acc;
    }
}

float softmax_block_portable(float* s, int64_t n, float scale, float* top, uint16_t* weights16) {
  float t = *top, sum = 0;
  for (int64_t j = 0; j < n; ++j) t = std::max(t, s[j] *= scale);
  for (int64_t j = 0; j < n; ++j) sum += s[j] = std::exp(s[j] - t);
  if (weights16)
    for (int64_t j = 0; j < n; ++j) weights16[j] = f32_to_bf16(s[j]);
  *top = t;
  return sum;
}

void scale_add_portable(float* out, const float* in, float scale, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float scaled = out[i] * scale;  // x86-64's baseline has no fma to contract this into
    out[i] = scaled + in[i];
  }
}

void attend(const AttendArgs& args, ThreadPool& pool) {
  run_attend(best_kernel_table(), args, pool);
}

void attend_with_isa(CpuIsa isa, const AttendArgs& args, ThreadPool& pool) {
  run_attend(kernel_table(isa), args, pool);
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

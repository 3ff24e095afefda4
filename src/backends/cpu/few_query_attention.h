#pragma once
// Attention's two products for a few queries (decode: one token's heads), against a sequence's
// KV cache rows:
//   key_scores:    s[q][j] = Σ_c x[q][c] · keys[j][c]     (every query against every key)
//   weighted_sums: out[q][c] = Σ_{j < keys} p[q][j] · rows[j][c]
//
// Why not F32 matmuls and per-query loops (as before, and as prefill still does): with 16 to
// 128 queries and thousands of keys they were bound by loads and by re-reading the cache. The
// per-query weighted sum read all the rows once per query, from L3 or DRAM once the context is
// long; the scores' row dots load both operands for every multiply and reduce each dot across
// lanes. Decode at 1.9k tokens of context spent 56% of its time in the two. Here:
//   key_scores transposes the queries once (16 per vector, one vector per column) and runs
//     eight keys at a time down the columns: per column one load, eight broadcasts, eight FMAs;
//   weighted_sums cuts the columns into slices of 64 and runs four queries at a time down the
//     keys of a slice (which stays in L2 while all the queries pass): per key four loads, four
//     broadcasts, sixteen FMAs.
// Each result adds its terms in order with one accumulator (fma on AVX-512, a multiply and an
// add on the portable level), so it depends only on its own query, keys and weights — never on
// how many queries or keys share the call.
#include <cstdint>

#include "backends/cpu/cpu_features.h"
#include "core/dtype.h"
#include "core/thread_pool.h"

namespace tandem::cpu {

struct KeyScoresArgs {
  const float* x = nullptr;  // [n_queries, x_stride]: the queries, columns 0 .. cols-1
  int64_t x_stride = 0;
  int64_t n_queries = 0;
  const float* keys = nullptr;  // [n_keys, key_stride]: columns 0 .. cols-1 used
  int64_t key_stride = 0;
  int64_t n_keys = 0;
  int64_t cols = 0;
  float* scores = nullptr;  // [n_queries, score_stride], columns 0 .. n_keys-1 written
  int64_t score_stride = 0;
};

struct WeightedSumsArgs {
  const float* p = nullptr;  // [n_queries, p_stride]: each query's weights of rows 0 .. keys-1
  int64_t p_stride = 0;
  int64_t n_queries = 0;
  const float* rows = nullptr;  // [keys, row_stride]: the rows summed; columns 0 .. n-1 used
  int64_t row_stride = 0;
  int64_t keys = 0;
  int64_t n = 0;  // columns, at most row_stride
  float* out = nullptr;  // [n_queries, out_stride], columns 0 .. n-1 written
  int64_t out_stride = 0;
};

// Softmax attention of a few tokens' queries over their sequence's cache rows, in one pass over
// the keys: out = Σ_j softmax_j(scale · x·keys[j]) · keys[j][0 .. n_out) (or the value rows), each
// token attending to keys first_key[t] .. last_key[t]. The keys go in blocks of kAttendBlock from
// key 0; a block's scores, their exponentials against the largest score so far and its weighted
// sums are computed while its rows are in L2 (the cache is read from memory once, not once for the
// scores and once for the sums). Blocks are merged in order into parts (one block, or 512 keys
// past 1024 keys), and the parts in order, rescaled to the overall maximum (and the sink, if any).
// One parallel job over (token, part). A token's result depends only on its queries and its own
// keys (the blocks start at its first key whatever the call, and a block stops at the ring's end),
// so it is the same alone and among others.
//
// A block is 256 keys (288 KiB of MLA's bf16 rows, in L2 while the sums pass over them): against
// 128, half the blocks' fixed work (the softmax calls, the sums' calls, the rescale of the part's
// sums). Measured on MLA only (attention_bench, 4096 keys, bf16 cache: ~6-8% faster, F32 ~3%); a
// grouped-query model's F32 rows (every group's keys and values) make larger blocks, up to about
// L2's size.
constexpr int64_t kAttendBlock = 256;

struct AttendArgs {
  const float* x = nullptr;  // [n_tokens * heads, x_stride]: token t's head h at row t * heads + h
  int64_t x_stride = 0;
  int64_t n_tokens = 0;
  int64_t heads = 0;
  const int32_t* last_key = nullptr;  // [n_tokens]: the last key each token attends to
  const void* keys = nullptr;         // [.., key_stride] of cache_type: columns 0 .. cols-1 scored
  int64_t key_stride = 0;
  int64_t cols = 0;
  int64_t n_out = 0;  // columns of each summed row (of the key rows themselves: at most cols)
  float scale = 1;
  float* out = nullptr;  // token t's head h at out + t * out_token_stride + h * out_head_stride
  int64_t out_token_stride = 0, out_head_stride = 0;

  // Grouped-query attention. The heads form kv_groups groups of consecutive heads; group g scores
  // columns [g * key_group_offset, + cols) of the key rows and sums columns
  // [g * value_group_offset, + n_out) of the value rows. MLA: one group, its keys summed.
  int64_t kv_groups = 1;
  int64_t key_group_offset = 0;
  const void* values = nullptr;  // [.., value_stride] rows summed, or null: the key rows
  int64_t value_stride = 0, value_group_offset = 0;
  // [n_tokens]: the first key each token attends to (a sliding window), or null: key 0.
  const int32_t* first_key = nullptr;
  // Key j is row j % ring of keys and values (a sliding-window cache), or row j when 0.
  int64_t ring = 0;
  // [heads]: one more logit per head in the softmax's denominator (attention sinks), or null.
  const float* sinks = nullptr;
  // F32, or BF16: keys and values as a BF16 KV cache holds them (strides in values, not bytes);
  // scores and sums then take kernels.h's bf16 kernels (queries and weights rounded to bf16;
  // cols even).
  DType cache_type = DType::F32;
};

// One parallel job each, with the kernels of best_cpu_isa().
void attend(const AttendArgs& args, ThreadPool& pool);
void attend_with_isa(CpuIsa isa, const AttendArgs& args, ThreadPool& pool);
void key_scores(const KeyScoresArgs& args, ThreadPool& pool);
void weighted_sums(const WeightedSumsArgs& args, ThreadPool& pool);
// The same with a chosen instruction set (tests); throw tandem::Error when the CPU lacks it.
void key_scores_with_isa(CpuIsa isa, const KeyScoresArgs& args, ThreadPool& pool);
void weighted_sums_with_isa(CpuIsa isa, const WeightedSumsArgs& args, ThreadPool& pool);

}  // namespace tandem::cpu

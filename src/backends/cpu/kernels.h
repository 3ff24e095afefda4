#pragma once
// Internal to the CPU backend: the table of row-dot kernels that matmul.cpp dispatches through,
// and the activation layouts the kernels read. One table per instruction set, filled once: the
// portable file fills every entry, then the AVX2 and AVX-512 files overwrite the entries they
// implement (so a format without a kernel at some level falls back to the level below).
//
// The kernel files compiled with -mavx2 / -mavx512* must not run any code at load time (no
// dynamic initializers): their functions are reached only through the table, after CPUID.
#include <cstddef>
#include <cstdint>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/matmul.h"
#include "core/blocks.h"

namespace tandem::cpu {

// How a kernel wants the activations x prepared before its dot products.
enum class ActKind : uint8_t {
  F32,   // used in place
  BF16,  // rounded to bf16 (uint16_t per element)
  Q8,    // ActBlockQ8 per 32 elements
  Q8_K,  // BlockQ8_K per 256 elements (core/blocks.h)
  Q16,   // 16-bit quants, one scale per 32 elements (layout in act_q16.h)
};
constexpr int kActKinds = 5;

// 8-bit activations for the 32-element weight formats: x ≈ d * qs, qs in [-127, 127]. `sum` is
// Σ qs; it turns the offsets of Q4_0 (-8), Q5_0 (-16), Q5_1 (+m) into one integer correction per
// block. The scale stays f32 (Q8_0 weights store f16): activation accuracy costs nothing here.
struct ActBlockQ8 {
  float d;
  int32_t sum;
  int8_t qs[32];
};
static_assert(sizeof(ActBlockQ8) == 40);

// One weight row against one token's prepared activations; `cols` elements.
using RowDotFn = float (*)(const void* weight_row, const void* act_row, int64_t cols);
// Prepares one token's activations (`cols` floats) in the layout of an ActKind.
using PrepareActFn = void (*)(const float* x, void* act_row, int64_t cols);

struct FormatKernel {
  ActKind act = ActKind::F32;
  RowDotFn dot = nullptr;  // nullptr: format not supported
};

// Indexed by the DType number (as in GGUF); F32 through MXFP4 (39).
constexpr int kDTypeSlots = 40;

constexpr int kActPrecisions = 2;

// The token-lanes path of the Int16 matmul for many tokens (gemm_q16.h): rows
// [first_row, last_row) of W against every tile of 16 prepared tokens.
struct LanesMatmul {
  DType type;
  const uint8_t* weights;
  size_t weight_stride;
  int64_t rows;
  int64_t cols;
  const uint8_t* tiles;  // ceil(n_tokens / 16) tiles of q16_tile_bytes(cols)
  int64_t n_tokens;
  float* output;  // [n_tokens, rows]
};
using LanesRowsFn = void (*)(const LanesMatmul& m, int64_t first_row, int64_t last_row);
// The tile of prepared tokens [first, first + n) (n <= 16) from rows `act_stride` bytes apart.
using BuildTileFn = void (*)(const uint8_t* act, size_t act_stride, int64_t first, int64_t n,
                             int64_t cols, uint8_t* tile);

// One 16-row group of an interleaved format (core/blocks.h, DType::*_R16) against one token's
// prepared activations: out[r] = row r · x for r < 16.
using GroupDotFn = void (*)(const void* group, const void* act_row, int64_t cols, float* out);

// few_query_attention.h's kernels. key_scores: scores[q * score_stride + j] = Σ_c
// x_t[16 c + q] · keys[j * key_stride + c] for q < n_queries (1 to 16; x_t holds 16 queries
// transposed), j < n_keys, c < cols. weighted_sums: out[q][c] = Σ_{j < keys} p[q][j] ·
// rows[j * row_stride + c] for c < cols (1 to 64) and q < n_queries (1 to 4).
using KeyScores16Fn = void (*)(const float* x_t, int n_queries, const float* keys, int64_t key_stride,
                               int64_t n_keys, int64_t cols, float* scores, int64_t score_stride);
using WeightedSums64Fn = void (*)(const float* const* p, int n_queries, const float* rows,
                                  int64_t row_stride, int64_t keys, int cols, float* const* out);
// The same two over a BF16 cache (--cache-type-k/v bf16), with vdpbf16ps's arithmetic: the
// queries and the weights rounded to bf16 too, products of pairs added to an F32 sum, the odd
// member of a pair first. key_scores: x_p holds 16 queries in pairs of columns (query q's columns
// 2i and 2i + 1 at x_p[32 i + 2 q] and x_p[32 i + 2 q + 1]; cols even), s += x·k over column pairs
// in order. weighted_sums: keys in pairs (j, j + 1) from key 0, out += p[j + 1] · row[j + 1] then
// p[j] · row[j]; an odd last key alone (p[q] may hold a zero after it: never read).
using KeyScores16Bf16Fn = void (*)(const uint16_t* x_p, int n_queries, const uint16_t* keys,
                                   int64_t key_stride, int64_t n_keys, int64_t cols, float* scores,
                                   int64_t score_stride);
using WeightedSums64Bf16Fn = void (*)(const uint16_t* const* p, int n_queries, const uint16_t* rows,
                                      int64_t row_stride, int64_t keys, int cols,
                                      float* const* out);
// One block of a query's scores turned into softmax terms: s[j] *= scale, *top = the larger of
// *top and every s[j], then s[j] = exp(s[j] - *top); returns Σ_j s[j] (n >= 1). When weights16 is
// not null, weights16[j] = f32_to_bf16(s[j]) for j < n too (nothing past n written): the BF16
// weighted sums' weights, rounded while the terms are in registers (a separate scalar pass cost
// 5% of MLA attention at 4096 keys).
using SoftmaxBlockFn = float (*)(float* s, int64_t n, float scale, float* top, uint16_t* weights16);
// out[i] = out[i] * scale + in[i] for i < n, a multiply and an add each rounded (never fused), so
// that every level gives the same bits: a part's sums so far rescaled to a new maximum and the
// next block's sums added.
using ScaleAddFn = void (*)(float* out, const float* in, float scale, int64_t n);
// The gated FFN's activation: gate[i] = silu(gate[i]) * up[i] for i < n (activations.h).
using SiluMulFn = void (*)(float* gate, const float* up, int64_t n);

struct KernelTable {
  FormatKernel formats[kActPrecisions][kDTypeSlots];  // [ActPrecision][DType]
  PrepareActFn prepare[kActKinds] = {};               // F32 has none: x is read in place
  // Int16 only; nullptr where a format (or the level) has no token-lanes path.
  LanesRowsFn lanes[kDTypeSlots] = {};
  // The Int8 token-lanes path (gemm_q8.h; ActKind::Q8 activations in its own tiles); nullptr where
  // a format (or the level) has none.
  LanesRowsFn lanes8[kDTypeSlots] = {};
  // Builds one of its tiles (gemm_q8.h's layout) from ActKind::Q8 rows; set with lanes8.
  BuildTileFn build_tile8 = nullptr;
  // Int16 only, indexed by the base format of an interleaved one (Q8_0 for Q8_0_R16); nullptr
  // where the level has none: matmul then takes each group apart into plain rows.
  GroupDotFn group_dots[kDTypeSlots] = {};
  // The same at Int8, against the plain format's 8-bit activations (its FormatKernel's act).
  GroupDotFn group_dots8[kDTypeSlots] = {};
  // Int16 only, indexed like group_dots: the token-lanes path reading interleaved groups (rows a
  // multiple of 16); nullptr: groups are taken apart for the plain lanes path.
  LanesRowsFn group_lanes[kDTypeSlots] = {};
  // The same for the Int8 token-lanes path (gemm_q8.h's tiles); nullptr: a task's groups are taken
  // apart for the plain 8-bit kernel.
  LanesRowsFn group_lanes8[kDTypeSlots] = {};
  // Every level has these seven.
  KeyScores16Fn key_scores_16 = nullptr;
  WeightedSums64Fn weighted_sums_64 = nullptr;
  KeyScores16Bf16Fn key_scores_16_bf16 = nullptr;
  WeightedSums64Bf16Fn weighted_sums_64_bf16 = nullptr;
  SoftmaxBlockFn softmax_block = nullptr;
  ScaleAddFn scale_add = nullptr;
  SiluMulFn silu_mul = nullptr;
};

// Bytes one token's prepared activations take in the scratch buffer (a multiple of 64).
size_t act_row_bytes(ActKind kind, int64_t cols);

// The table of one level, built on first use; throws tandem::Error if the CPU lacks `isa`.
const KernelTable& kernel_table(CpuIsa isa);
// kernel_table(best_cpu_isa()), looked up once.
const KernelTable& best_kernel_table();

// Each fills both precisions' float formats and the Int8 quantized ones; the *_q16 files fill
// the Int16 quantized ones.
void fill_portable_kernels(KernelTable& table);
void fill_avx2_kernels(KernelTable& table);
void fill_avx512_kernels(KernelTable& table);
void fill_portable_q16_kernels(KernelTable& table);
void fill_avx2_q16_kernels(KernelTable& table);
void fill_avx512_q16_kernels(KernelTable& table);
// Token-lanes kernels (gemm_q16_*.cpp, gemm_q8_*.cpp); the AVX-512 level needs VNNI.
void fill_portable_lanes_kernels(KernelTable& table);
void fill_avx512_lanes_kernels(KernelTable& table);
void fill_portable_lanes8_kernels(KernelTable& table);
void fill_avx512_lanes8_kernels(KernelTable& table);
// Interleaved-format kernels (dot_r16_avx512.cpp, dot_r16_q8_avx512.cpp).
void fill_avx512_group_kernels(KernelTable& table);
void fill_avx512_group8_kernels(KernelTable& table);
// few_query_attention.h's kernels (few_query_attention.cpp and its _avx512 file).
void key_scores_16_portable(const float* x_t, int n_queries, const float* keys, int64_t key_stride,
                            int64_t n_keys, int64_t cols, float* scores, int64_t score_stride);
void weighted_sums_64_portable(const float* const* p, int n_queries, const float* rows,
                               int64_t row_stride, int64_t keys, int cols, float* const* out);
float softmax_block_portable(float* s, int64_t n, float scale, float* top, uint16_t* weights16);
void scale_add_portable(float* out, const float* in, float scale, int64_t n);
void key_scores_16_bf16_portable(const uint16_t* x_p, int n_queries, const uint16_t* keys,
                                 int64_t key_stride, int64_t n_keys, int64_t cols, float* scores,
                                 int64_t score_stride);
void weighted_sums_64_bf16_portable(const uint16_t* const* p, int n_queries, const uint16_t* rows,
                                    int64_t row_stride, int64_t keys, int cols, float* const* out);
// activations.cpp and its _avx512 file.
void silu_mul_portable(float* gate, const float* up, int64_t n);
void fill_avx512_activations(KernelTable& table);
void fill_avx512_few_query_attention(KernelTable& table);

// The tile of prepared tokens [first, first + n) (n <= 16), in gemm_q16.h's layout.
void build_lanes_tile(const uint8_t* act, size_t act_stride, int64_t first, int64_t n,
                      int64_t cols, uint8_t* tile);
size_t lanes_tile_bytes(int64_t cols);
// The Int8 path's tile size (gemm_q8.h's layout; KernelTable::build_tile8 builds them).
size_t lanes8_tile_bytes(int64_t cols);

}  // namespace tandem::cpu

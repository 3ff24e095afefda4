#pragma once
// y = W·x on the CPU for every weight format tandem reads.
//
// W is [rows, cols], row-major, each row row_bytes(weight_type, cols) bytes, used in place (for
// example straight from the mmap'd GGUF file). x is [n_tokens, cols] F32, y is [n_tokens, rows]
// F32. Quantized formats quantize x once per call and take integer dot products per block:
// by default (ActPrecision::Int16) to 16 bits with one scale per 32 elements, which keeps the
// result within ~1e-5 of f32 activations; ActPrecision::Int8 quantizes to 8 bits (Q8_0-style
// blocks of 32, Q8_K super-blocks of 256 for the k-quants' row dots) as the fast engines do,
// ~250x less accurate and enough to flip expert choices of sigmoid-routed models when every
// product takes it, ~1.5x the many-token throughput (vpdpbusd: four products per lane and
// instruction where vpdpwssd does two). The model's precision policy (PrecisionPolicy in
// model/deepseek2.h) gives it to the feed-forward products only. F32/F16 multiply in float;
// so does BF16, except that Int8 on AVX-512 rounds x to bf16 for the bf16 dot-product instruction.
// Accuracy per format and precision: kInt16ErrorBound, kInt8ErrorBound in
// tests/cpu/matmul_test.cpp.
#include <cstdint>
#include <span>
#include <vector>

#include "backends/cpu/cpu_features.h"
#include "core/backend.h"
#include "core/dtype.h"
#include "core/thread_pool.h"

namespace tandem::cpu {

// How finely quantized formats quantize the activations x (see above).
enum class ActPrecision : uint8_t {
  Int16,  // default: near-f32 accuracy
  Int8,   // faster to compute, 8-bit activation error: the FFNs' products by default
};

struct MatmulArgs {
  DType weight_type = DType::F32;
  const void* weights = nullptr;  // [rows, cols] in weight_type
  int64_t rows = 0;
  int64_t cols = 0;              // a multiple of the format's block size
  const float* input = nullptr;  // [n_tokens, cols]
  int64_t n_tokens = 0;
  float* output = nullptr;  // [n_tokens, rows]; must not overlap input
  ActPrecision precision = ActPrecision::Int16;
  KernelChoice kernels = KernelChoice::ByTokenCount;  // see core/backend.h
};

// From this many tokens on, matmuls of Q8_0, Q4_0, Q5_0, Q4_1, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS,
// MXFP4, TQ1_0, TQ2_0 and the grid i-quants take the token-lanes path (gemm_q16.h for Int16, gemm_q8.h for Int8; on AVX-512 and
// portable): each row unpacked once, 16 tokens per vector. A 16-bit tile costs ~6.7 row dots whatever its
// fill (matmul_bench "tokens/": 69 us per token as row dots at 1-3 tokens, 460 us per tile), so
// below 8 tokens the row dots are faster; an 8-bit tile costs 3-5 of its row dots (Q4_K, Q8_0,
// Q6_K at 1408x2048: 280-350 us against 65-95 us), so from 5 tokens on it is the faster.
// KernelChoice::PerToken never takes it, KernelChoice::Tiled takes it from one token on.
constexpr int64_t kLanesMinTokens = 8;
constexpr int64_t kLanes8MinTokens = 5;

// Formats matmul accepts: F32, F16, BF16, Q4_0, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
// IQ4_NL, IQ4_XS, MXFP4, Q4_1, TQ1_0, TQ2_0, the grid i-quants IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS,
// IQ2_S, IQ3_XXS, IQ3_S (portable kernels only so far), and the 16-row interleaved Q8_0_R16,
// Q5_0_R16, Q4_K_R16 (`tandem repack`; rows a multiple of 16).
// An interleaved matrix gives what its base format's rows would give with the same kernels,
// except that the row dots on AVX-512 are replaced by kernels that take 16 rows at once
// (dot_r16_avx512.cpp: about twice the decode speed; rounding differs, accuracy is the same).
// Those, and the token-lanes kernels that read whole groups, are 16-bit, and an Int8 matmul of an
// interleaved format runs them too (more accurate, and faster than taking the groups apart for
// the 8-bit kernels). IQ4_NL / IQ4_XS / MXFP4 / Q4_1 / TQ1_0 / TQ2_0 and the grid formats have no
// 8-bit row dots: their Int8 row dots are the 16-bit ones (their token lanes are 8-bit).
bool matmul_supports(DType weight_type);

// Uses the kernels of best_cpu_isa(). Throws tandem::Error for a format it does not support or
// a `cols` that is not a multiple of the block size. Allocates only when a call needs more
// activation scratch than any earlier call on this thread.
void matmul(const MatmulArgs& args, ThreadPool& pool);

// The same with a chosen instruction set (tests and benchmarks); throws tandem::Error when the
// CPU lacks it. Formats without a kernel for `isa` use the next lower level's.
void matmul_with_isa(CpuIsa isa, const MatmulArgs& args, ThreadPool& pool);

// Independent matmuls (outputs must not overlap any input) run as one parallel job: every
// activation is prepared first, then the row tiles of all the matrices are spread over the
// threads together, so no thread idles at the end of a small matrix while another finishes it
// (the active experts of a MoE layer at decode are a dozen matrices of ~1 MiB each). Each output
// is bit-identical to what matmul() gives for the same arguments: the rows are cut differently,
// but each row's arithmetic is the same.
void matmul_many(std::span<const MatmulArgs> args, ThreadPool& pool);
void matmul_many_with_isa(CpuIsa isa, std::span<const MatmulArgs> args, ThreadPool& pool);

// A task of a parallel matmul: rows [first, last) of matrix `matmul` of a list.
struct RowTask {
  size_t matmul = 0;
  int64_t first = 0;
  int64_t last = 0;
};

// How matmul and matmul_many cut the rows of their matrices (`rows[i]` each) into tasks the
// threads claim in order, largest first: each takes what is left divided by twice the thread
// count (a quarter on two threads), rounded up to a multiple of 16 rows (the interleaved formats
// store 16 rows together, the token-lanes kernels take four), and never crosses into the next
// matrix (so a matrix's last task may be shorter); one thread takes each matrix whole. Large first
// tasks stream long runs of weights (tasks of at most 256 rows, as before, decoded 7% slower on two
// threads: lite tg64, five rounds); small last ones leave little waiting at the end, where equal
// tasks leave half of one a thread. Each task is whole rows x all tokens, so each weight row is
// fetched once and reused from L1 for every token.
void cut_into_tasks(std::span<const int64_t> rows, int n_threads, std::vector<RowTask>& tasks);

}  // namespace tandem::cpu

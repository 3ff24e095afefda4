// Every (instruction set, weight format, shape) against the scalar reference: each weight row
// dequantized by src/quant and dotted in double with the *unquantized* activations, so the
// measured error includes the kernels' own activation quantization.
#include "backends/cpu/matmul.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "backends/cpu/kernels.h"
#include "core/blocks.h"
#include "core/error.h"
#include "core/half.h"
#include "quant/quant.h"
#include "test_weights.h"

namespace tandem::cpu {
namespace {

// Normalized error: |y - y_ref| / Σ_k |w_k x_k| over the row. Dividing by the sum of absolute
// products (not |y_ref|) keeps the measure meaningful when the dot product cancels to near zero,
// and makes it a relative error per element: an error of e in every product gives at most e.
//
// Bounds per precision, and why (measured worst over all shapes and levels here in brackets).
// Any layout bug (a wrong nibble, sub-block scale, min or bit plane) costs 0.1 or more.
//
// Int16 (the default):
// - F32, F16, BF16: only f32 rounding in the accumulation (weights decode exactly; every level
//   multiplies in f32); errors of random sign grow as sqrt(n) * 2^-24 [1.9e-7].
// - Quantized formats: x is quantized to 16 bits with one scale per 32 elements, |dx| <= amax /
//   65534 per element, 258x finer than Int8's amax / 254. The 32-element formats' Int8 worst
//   (4.0e-3, below) over 258 predicts 1.5e-5 [1.2e-5 to 1.7e-5]; the k-quants do better than
//   their Int8 worst / 258 (1.2e-5) because their activation scale is now per 32, not per 256
//   [6.6e-6 to 8.2e-6]. Bounds are 3x those: at this level the f32 rounding of the per-block
//   products and of the sums (~1e-7 each) starts to count, and the worst case depends on seeds.
//
// Int8:
// - F32, F16: as Int16.
// - BF16: the AVX-512 kernel rounds x to bf16 (8 significant bits) for vdpbf16ps: at most 2^-8
//   = 3.9e-3 relative per product, so at most 3.9e-3 here even if every rounding had the same
//   sign [2.2e-3]. The other levels multiply in f32 (as F32).
// - Quantized formats: x is quantized to 8 bits with one scale per 32 (Q8_0-style) or 256
//   (Q8_K) elements, |dx| <= amax / 254 per element. Gaussian x has amax ~ 2.5 sigma per 32
//   against E|x| = 0.8 sigma, so errors all pointing the same way could reach ~1.2e-2; they are
//   independent and of random sign, so the measure shrinks as 1/sqrt(cols) and the worst case
//   here is the shortest rows (64 elements) [3.9e-3 to 4.0e-3 for the 32-element formats,
//   2.6e-3 to 3.0e-3 for the k-quants, whose shortest row is 256].
struct FormatBound {
  DType type;
  double bound;
};
constexpr FormatBound kInt16ErrorBound[] = {
    {DType::F32, 1e-5},  {DType::F16, 1e-5},  {DType::BF16, 1e-5}, {DType::Q8_0, 5e-5},
    {DType::Q4_0, 5e-5}, {DType::Q5_0, 5e-5}, {DType::Q5_1, 5e-5}, {DType::Q4_1, 5e-5},
    {DType::Q2_K, 3e-5},
    {DType::Q3_K, 3e-5}, {DType::Q4_K, 3e-5}, {DType::Q5_K, 3e-5}, {DType::Q6_K, 3e-5},
    // The IQ4 levels and MXFP4's doubled E2M1 values are 8-bit signed weights with one scale per
    // 32: as Q4_0.
    {DType::IQ4_NL, 5e-5}, {DType::IQ4_XS, 5e-5}, {DType::MXFP4, 5e-5},
    // Ternary weights, one scale per 256: as Q4_0.
    {DType::TQ1_0, 5e-5}, {DType::TQ2_0, 5e-5},
    // The grid i-quants: signed weights |w| <= 62, a scale per 16 or 32: as Q4_0.
    {DType::IQ1_S, 5e-5}, {DType::IQ1_M, 5e-5}, {DType::IQ2_XXS, 5e-5}, {DType::IQ2_XS, 5e-5},
    {DType::IQ2_S, 5e-5}, {DType::IQ3_XXS, 5e-5}, {DType::IQ3_S, 5e-5},
};
constexpr FormatBound kInt8ErrorBound[] = {
    {DType::F32, 1e-5},  {DType::F16, 1e-5},  {DType::BF16, 4e-3}, {DType::Q8_0, 1e-2},
    // Q4_1: 16-bit row dots, 8-bit token lanes (as IQ4 below).
    {DType::Q4_0, 1e-2}, {DType::Q5_0, 1e-2}, {DType::Q5_1, 1e-2}, {DType::Q4_1, 1e-2},
    {DType::Q2_K, 8e-3},
    {DType::Q3_K, 8e-3}, {DType::Q4_K, 8e-3}, {DType::Q5_K, 8e-3}, {DType::Q6_K, 8e-3},
    // IQ4 and MXFP4: the 16-bit row dots (no 8-bit ones), but from kLanes8MinTokens tokens on
    // the 8-bit token lanes (gemm_q8.h, one scale per 32): as Q4_0.
    {DType::IQ4_NL, 1e-2}, {DType::IQ4_XS, 1e-2}, {DType::MXFP4, 1e-2},
    // TQ1_0 / TQ2_0 likewise.
    {DType::TQ1_0, 1e-2}, {DType::TQ2_0, 1e-2},
    {DType::IQ1_S, 1e-2}, {DType::IQ1_M, 1e-2}, {DType::IQ2_XXS, 1e-2}, {DType::IQ2_XS, 1e-2},
    {DType::IQ2_S, 1e-2}, {DType::IQ3_XXS, 1e-2}, {DType::IQ3_S, 1e-2},
};

constexpr ActPrecision kPrecisions[] = {ActPrecision::Int16, ActPrecision::Int8};

const char* precision_name(ActPrecision precision) {
  return precision == ActPrecision::Int16 ? "int16" : "int8";
}

std::span<const FormatBound> error_bounds(ActPrecision precision) {
  if (precision == ActPrecision::Int16) return kInt16ErrorBound;
  return kInt8ErrorBound;
}

bool is_k_quant(DType type) {
  return dtype_info(type).block_elems == uint32_t(kQK_K);
}

// Formats quantize_row cannot write get random blocks with sane fp16 scales (the kernels only
// need to agree with dequantize_row, not with any particular quantizer).
using test::gaussian;
using test::make_weights;
using test::written_raw;

struct Reference {
  std::vector<double> y;        // [n_tokens, rows]
  std::vector<double> abs_sum;  // [n_tokens, rows]: Σ_k |w_k x_k|
};

Reference reference_matmul(DType type, const std::vector<uint8_t>& weights, int64_t rows,
                           int64_t cols, const std::vector<float>& x, int64_t n_tokens) {
  Reference ref{std::vector<double>(size_t(rows * n_tokens)),
                std::vector<double>(size_t(rows * n_tokens))};
  std::vector<float> w(static_cast<size_t>(cols));
  const size_t stride = row_bytes(type, uint64_t(cols));
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(type, weights.data() + size_t(r) * stride, w.data(), cols);
    for (int64_t t = 0; t < n_tokens; ++t) {
      double sum = 0.0, abs_sum = 0.0;
      for (int64_t k = 0; k < cols; ++k) {
        const double p = double(w[size_t(k)]) * double(x[size_t(t * cols + k)]);
        sum += p;
        abs_sum += std::fabs(p);
      }
      ref.y[size_t(t * rows + r)] = sum;
      ref.abs_sum[size_t(t * rows + r)] = abs_sum;
    }
  }
  return ref;
}

// Largest normalized error of y against the reference.
double max_normalized_error(const std::vector<float>& y, const Reference& ref) {
  double worst = 0.0;
  for (size_t i = 0; i < y.size(); ++i) {
    const double scale = std::max(ref.abs_sum[i], 1e-30);
    const double e = std::fabs(double(y[i]) - ref.y[i]) / scale;
    worst = std::max(worst, std::isfinite(e) ? e : INFINITY);
  }
  return worst;
}

std::vector<float> run(CpuIsa isa, DType type, const std::vector<uint8_t>& weights, int64_t rows,
                       int64_t cols, const std::vector<float>& x, int64_t n_tokens,
                       ThreadPool& pool, ActPrecision precision) {
  std::vector<float> y(size_t(rows * n_tokens), NAN);
  matmul_with_isa(isa,
                  {.weight_type = type,
                   .weights = weights.data(),
                   .rows = rows,
                   .cols = cols,
                   .input = x.data(),
                   .n_tokens = n_tokens,
                   .output = y.data(),
                   .precision = precision},
                  pool);
  return y;
}

std::vector<int64_t> test_cols(DType type) {
  if (is_k_quant(type)) return {256, 512, 768, 2048};
  if (dtype_info(type).block_elems == 32) return {64, 96, 160, 256, 512, 1408, 2048};
  return {7, 33, 64, 96, 100, 160, 256, 512, 1408, 2048};  // float formats: ragged tails too
}

TEST(Matmul, EveryIsaFormatShapeAndPrecisionMatchesScalarReference) {
  ThreadPool pool(3);
  const int64_t rows = 37;  // not a multiple of any tile
  for (ActPrecision precision : kPrecisions) {
    std::printf("  %s activations:\n", precision_name(precision));
    for (const FormatBound& format : error_bounds(precision)) {
      double worst_format = 0.0;
      for (int64_t cols : test_cols(format.type)) {
        const std::vector<uint8_t> weights = make_weights(format.type, rows, cols, uint32_t(cols));
        for (int64_t n_tokens : {1, 3, 6, 17}) {
          const std::vector<float> x = gaussian(size_t(n_tokens * cols), uint32_t(1000 + cols + n_tokens));
          const Reference ref = reference_matmul(format.type, weights, rows, cols, x, n_tokens);
          for (CpuIsa isa : supported_cpu_isas()) {
            const std::vector<float> y =
                run(isa, format.type, weights, rows, cols, x, n_tokens, pool, precision);
            const double error = max_normalized_error(y, ref);
            worst_format = std::max(worst_format, error);
            EXPECT_LE(error, format.bound) << dtype_name(format.type) << " " << cpu_isa_name(isa)
                                           << " " << precision_name(precision) << " rows=" << rows
                                           << " cols=" << cols << " n_tokens=" << n_tokens;
          }
        }
      }
      std::printf("    %-5s worst normalized error %.3g (bound %.3g)\n",
                  std::string(dtype_name(format.type)).c_str(), worst_format, format.bound);
    }
  }
}

// Activations of real models have outlier channels hundreds of times larger than the rest. One
// scale per 32 elements confines an outlier's cost to its own block: there the other 31 elements
// get a step 300x coarser (~300 sigma / 65534), which with three such blocks per row costs a few
// 1e-5 [5.1e-5]; bound 1e-4. (Int8 is at 2.6e-3 to 4e-3 on plain Gaussian x, before outliers.)
TEST(Matmul, Int16ActivationsStayAccurateWithOutlierChannels) {
  ThreadPool pool(1);
  const int64_t rows = 16, cols = 2048, n_tokens = 2;
  std::vector<float> x = gaussian(size_t(n_tokens * cols), 51);
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t k : {5, 700, 1500}) x[size_t(t * cols + k)] *= 300.0f;
  double worst = 0.0;
  for (const FormatBound& format : kInt16ErrorBound) {
    const std::vector<uint8_t> weights = make_weights(format.type, rows, cols, 52);
    const Reference ref = reference_matmul(format.type, weights, rows, cols, x, n_tokens);
    for (CpuIsa isa : supported_cpu_isas()) {
      const double error = max_normalized_error(
          run(isa, format.type, weights, rows, cols, x, n_tokens, pool, ActPrecision::Int16), ref);
      worst = std::max(worst, error);
      EXPECT_LE(error, 1e-4) << dtype_name(format.type) << " " << cpu_isa_name(isa);
    }
  }
  std::printf("  worst normalized error with outlier channels %.3g (bound 1e-4)\n", worst);
}

// Formats without token lanes (F32, F16, BF16) run a prompt a block of tokens at a time: a token's
// outputs are those it gets alone, across the blocks' edges (16 tokens of 2048 F32 per block).
TEST(Matmul, PlainRowsOverTokenBlocksGiveEachTokenItsOwnResult) {
  ThreadPool pool(2);
  const int64_t rows = 40, cols = 2048, n_tokens = 37;
  for (DType type : {DType::F32, DType::BF16}) {
    const std::vector<uint8_t> weights = make_weights(type, rows, cols, 9);
    const std::vector<float> x = gaussian(size_t(n_tokens * cols), 10);
    for (CpuIsa isa : supported_cpu_isas()) {
      const std::vector<float> all =
          run(isa, type, weights, rows, cols, x, n_tokens, pool, ActPrecision::Int16);
      for (int64_t t = 0; t < n_tokens; ++t) {
        const std::vector<float> one(x.begin() + t * cols, x.begin() + (t + 1) * cols);
        const std::vector<float> alone =
            run(isa, type, weights, rows, cols, one, 1, pool, ActPrecision::Int16);
        EXPECT_TRUE(std::equal(alone.begin(), alone.end(), all.begin() + t * rows))
            << dtype_name(type) << " " << cpu_isa_name(isa) << " token " << t;
      }
    }
  }
}

TEST(Matmul, ManyRowsSplitOverThreadsMatchReference) {
  // Enough rows for many tasks per thread, with a ragged last tile.
  ThreadPool pool(2);
  const int64_t rows = 1029, cols = 512, n_tokens = 3;
  for (DType type : {DType::Q4_K, DType::Q8_0, DType::BF16}) {
    const std::vector<uint8_t> weights = make_weights(type, rows, cols, 7);
    const std::vector<float> x = gaussian(size_t(n_tokens * cols), 8);
    const Reference ref = reference_matmul(type, weights, rows, cols, x, n_tokens);
    for (CpuIsa isa : supported_cpu_isas()) {
      for (ActPrecision precision : kPrecisions) {
        const double bound = precision == ActPrecision::Int16 ? 5e-5 : 8e-3;
        EXPECT_LE(max_normalized_error(
                      run(isa, type, weights, rows, cols, x, n_tokens, pool, precision), ref),
                  bound)
            << dtype_name(type) << " " << cpu_isa_name(isa) << " " << precision_name(precision);
      }
    }
  }
}

// The integer sums per block are exact at every level and the activation preparation is shared,
// so levels differ only by f32 summation order — except BF16 on AVX-512 at Int8, which rounds x
// to bf16.
TEST(Matmul, AllIsaVariantsAgreeWithPortable) {
  ThreadPool pool(2);
  const int64_t rows = 64, n_tokens = 3;
  for (ActPrecision precision : kPrecisions) {
    for (const FormatBound& format : error_bounds(precision)) {
      const int64_t cols = is_k_quant(format.type) ? 2048 : 1408;
      const std::vector<uint8_t> weights = make_weights(format.type, rows, cols, 11);
      const std::vector<float> x = gaussian(size_t(n_tokens * cols), 12);
      const Reference ref = reference_matmul(format.type, weights, rows, cols, x, n_tokens);
      const std::vector<float> portable =
          run(CpuIsa::Portable, format.type, weights, rows, cols, x, n_tokens, pool, precision);
      for (CpuIsa isa : supported_cpu_isas()) {
        const std::vector<float> y =
            run(isa, format.type, weights, rows, cols, x, n_tokens, pool, precision);
        const bool bf16_rounding =
            format.type == DType::BF16 && isa == CpuIsa::Avx512 && precision == ActPrecision::Int8;
        const double bound = bf16_rounding ? 4e-3 : 2e-6;
        for (size_t i = 0; i < y.size(); ++i)
          ASSERT_LE(std::fabs(double(y[i]) - double(portable[i])) / ref.abs_sum[i], bound)
              << dtype_name(format.type) << " " << cpu_isa_name(isa) << " "
              << precision_name(precision) << " output " << i;
      }
    }
  }
}

// The kernels of every level read the same prepared activations; a level with its own (SIMD)
// preparation must produce the portable bytes exactly, or the levels would stop agreeing.
TEST(Matmul, ActivationQuantizationIsBitIdenticalAcrossIsas) {
  const int64_t cols = 2048;
  std::vector<float> x = gaussian(size_t(cols), 41);
  x[5] = 0.0f;                                            // zeros and exact ties
  for (int64_t k = 32; k < 64; ++k) x[size_t(k)] = 0.0f;  // an all-zero block
  for (int64_t k = 64; k < 96; ++k) x[size_t(k)] = float(k % 5) * 0.5f - 1.0f;
  for (ActKind kind : {ActKind::Q8, ActKind::Q8_K, ActKind::Q16}) {
    const size_t bytes = act_row_bytes(kind, cols);
    std::vector<uint8_t> expected(bytes), actual(bytes);
    const KernelTable& portable = kernel_table(CpuIsa::Portable);
    portable.prepare[size_t(kind)](x.data(), expected.data(), cols);
    for (CpuIsa isa : supported_cpu_isas()) {
      kernel_table(isa).prepare[size_t(kind)](x.data(), actual.data(), cols);
      EXPECT_EQ(std::memcmp(expected.data(), actual.data(), bytes), 0)
          << cpu_isa_name(isa) << " activation kind " << int(kind);
    }
  }
}

// On a machine with AVX-512 the default path never runs the portable kernels, so they are
// checked here explicitly, in every format, against the reference.
TEST(Matmul, PortableKernelsAreExercisedOnEveryMachine) {
  ThreadPool pool(1);
  const int64_t rows = 5, cols = 512, n_tokens = 2;
  for (ActPrecision precision : kPrecisions) {
    for (const FormatBound& format : error_bounds(precision)) {
      const std::vector<uint8_t> weights = make_weights(format.type, rows, cols, 21);
      const std::vector<float> x = gaussian(size_t(n_tokens * cols), 22);
      const Reference ref = reference_matmul(format.type, weights, rows, cols, x, n_tokens);
      const std::vector<float> y =
          run(CpuIsa::Portable, format.type, weights, rows, cols, x, n_tokens, pool, precision);
      EXPECT_LE(max_normalized_error(y, ref), format.bound)
          << dtype_name(format.type) << " " << precision_name(precision);
    }
  }
}

TEST(Matmul, DefaultEntryUsesTheBestIsaAndInt16) {
  ThreadPool pool(2);
  const int64_t rows = 40, cols = 256, n_tokens = 2;
  const std::vector<uint8_t> weights = make_weights(DType::Q6_K, rows, cols, 31);
  const std::vector<float> x = gaussian(size_t(n_tokens * cols), 32);
  std::vector<float> y(size_t(rows * n_tokens));
  matmul({.weight_type = DType::Q6_K,
          .weights = weights.data(),
          .rows = rows,
          .cols = cols,
          .input = x.data(),
          .n_tokens = n_tokens,
          .output = y.data()},
         pool);
  EXPECT_EQ(y, run(best_cpu_isa(), DType::Q6_K, weights, rows, cols, x, n_tokens, pool,
                   ActPrecision::Int16));
  EXPECT_EQ(MatmulArgs{}.precision, ActPrecision::Int16);
}

TEST(Matmul, RejectsUnsupportedFormatsAndRaggedRows) {
  ThreadPool pool(1);
  std::vector<uint8_t> weights(4096);
  std::vector<float> x(256), y(4);
  MatmulArgs args{.weight_type = DType::Q8_K,  // an activation format, never a weight
                  .weights = weights.data(),
                  .rows = 1,
                  .cols = 256,
                  .input = x.data(),
                  .n_tokens = 1,
                  .output = y.data()};
  EXPECT_FALSE(matmul_supports(DType::Q8_K));
  EXPECT_THROW(matmul(args, pool), Error);
  args.weight_type = DType::Q4_K;
  args.cols = 200;  // not a whole super-block
  EXPECT_THROW(matmul(args, pool), Error);
}

TEST(Matmul, EmptyShapesWriteNothing) {
  ThreadPool pool(2);
  std::vector<float> y(4, 42.0f);
  const float x[1] = {};
  matmul({.weight_type = DType::Q8_0,
          .weights = nullptr,
          .rows = 0,
          .cols = 32,
          .input = x,
          .n_tokens = 1,
          .output = y.data()},
         pool);
  EXPECT_EQ(y, std::vector<float>(4, 42.0f));
}

}  // namespace
}  // namespace tandem::cpu

namespace tandem::cpu {
namespace {

// Equal as bytes: NaN outputs (never written) compare unequal to any result.
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// matmul_many cuts rows into tasks across all the matrices at once, and prepares an input once
// for consecutive matrices that read it (a MoE's gate and up); every output must be the same bits
// that one matmul() per matrix gives, at every level and precision, for one token, a few (row
// dots) and enough for the token-lanes path, with an empty matrix in the middle of the list.
TEST(MatmulMany, EachOutputBitIdenticalToItsOwnMatmul) {
  ThreadPool pool(2);
  struct Spec {
    DType type;
    int64_t rows, cols;
    int same_input_as = -1;  // reads the input of that earlier spec
  };
  const std::vector<Spec> specs = {{DType::Q4_K, 300, 512},    {DType::Q4_K, 64, 512, 0},
                                   {DType::Q8_0, 0, 64},       {DType::Q5_0, 77, 1408},
                                   {DType::Q6_K, 129, 256},    {DType::Q4_K, 48, 256, 4},
                                   {DType::BF16, 33, 100}};
  for (ActPrecision precision : kPrecisions) {
    for (int64_t n_tokens : {int64_t(1), int64_t(3), kLanesMinTokens + 1}) {
      std::vector<std::vector<uint8_t>> weights;
      std::vector<std::vector<float>> inputs;
      for (size_t i = 0; i < specs.size(); ++i) {
        weights.push_back(make_weights(specs[i].type, specs[i].rows, specs[i].cols, 40 + i));
        inputs.push_back(specs[i].same_input_as >= 0
                             ? inputs[size_t(specs[i].same_input_as)]
                             : gaussian(size_t(n_tokens * specs[i].cols), 50 + uint32_t(i)));
      }
      for (CpuIsa isa : supported_cpu_isas()) {
        std::vector<std::vector<float>> outputs(specs.size());
        std::vector<MatmulArgs> args;
        for (size_t i = 0; i < specs.size(); ++i) {
          outputs[i].assign(size_t(specs[i].rows * n_tokens), NAN);
          const int source = specs[i].same_input_as >= 0 ? specs[i].same_input_as : int(i);
          args.push_back({.weight_type = specs[i].type,
                          .weights = weights[i].data(),
                          .rows = specs[i].rows,
                          .cols = specs[i].cols,
                          .input = inputs[size_t(source)].data(),
                          .n_tokens = n_tokens,
                          .output = outputs[i].data(),
                          .precision = precision});
        }
        matmul_many_with_isa(isa, args, pool);
        for (size_t i = 0; i < specs.size(); ++i) {
          const std::vector<float> alone = run(isa, specs[i].type, weights[i], specs[i].rows,
                                               specs[i].cols, inputs[i], n_tokens, pool, precision);
          EXPECT_TRUE(same_bits(outputs[i], alone))
              << dtype_name(specs[i].type) << " " << cpu_isa_name(isa) << " "
              << precision_name(precision) << " tokens " << n_tokens << " spec " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace tandem::cpu

namespace tandem::cpu {
namespace {

constexpr DType kLanesFormats[] = {DType::Q8_0, DType::Q4_0, DType::Q5_0,  DType::Q4_K,
                                   DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS};

// From kLanesMinTokens on, matmuls of these formats run the token-lanes paths (gemm_q16.h for
// Int16, gemm_q8.h for Int8). Their AVX-512 versions must give the portable versions' bits: the
// same exact integer group sums, then the same float operations per lane in the same order.
// Every format of kLanesFormats has token lanes at both precisions on the levels that take them
// (a format whose unpacking shape has no kernel variant would silently fall back to row dots).
TEST(MatmulLanes, EveryLanesFormatHasKernelsAtBothPrecisions) {
  for (CpuIsa isa : {CpuIsa::Portable, CpuIsa::Avx512}) {
    if (!cpu_supports(isa)) continue;
    const KernelTable& table = kernel_table(isa);
    for (DType type : kLanesFormats) {
      EXPECT_NE(table.lanes[size_t(type)], nullptr) << dtype_name(type) << " " << cpu_isa_name(isa);
      EXPECT_NE(table.lanes8[size_t(type)], nullptr) << dtype_name(type) << " " << cpu_isa_name(isa);
    }
  }
}

TEST(MatmulLanes, Avx512GivesThePortableBits) {
  if (!cpu_supports(CpuIsa::Avx512)) GTEST_SKIP() << "no AVX-512 on this CPU";
  ThreadPool pool(2);
  const int64_t rows = 37;  // whole 16-row blocks, then 4 rows and 1
  for (ActPrecision precision : kPrecisions) {
    for (DType type : kLanesFormats) {
      // Neither a multiple of the AVX-512 kernels' 512-column chunks at 8 bits: a short last one.
      const int64_t cols = is_k_quant(type) ? 2304 : 1408;
      const std::vector<uint8_t> weights = make_weights(type, rows, cols, 21);
      // one tile, a pair of tiles with a partial second, two pairs and a last tile alone
      for (int64_t n_tokens : {kLanesMinTokens, int64_t(16), int64_t(21), int64_t(65)}) {
        const std::vector<float> x = gaussian(size_t(n_tokens * cols), 22);
        const std::vector<float> portable =
            run(CpuIsa::Portable, type, weights, rows, cols, x, n_tokens, pool, precision);
        const std::vector<float> avx512 =
            run(CpuIsa::Avx512, type, weights, rows, cols, x, n_tokens, pool, precision);
        EXPECT_TRUE(same_bits(portable, avx512))
            << dtype_name(type) << " " << precision_name(precision) << " n_tokens " << n_tokens;
      }
    }
  }
}

// The 8-bit tiles are built by each level's own builder (AVX-512: a transpose in registers); the
// bytes must be the portable builder's, for full and partial tiles (missing tokens zero).
TEST(MatmulLanes, Avx512TileBuilderGivesThePortableBytes) {
  if (!cpu_supports(CpuIsa::Avx512)) GTEST_SKIP() << "no AVX-512 on this CPU";
  const KernelTable& portable = kernel_table(CpuIsa::Portable);
  const KernelTable& avx512 = kernel_table(CpuIsa::Avx512);
  const int64_t cols = 256, tokens = 19;
  const size_t row_bytes = act_row_bytes(ActKind::Q8, cols);
  const std::vector<float> x = gaussian(size_t(tokens * cols), 23);
  std::vector<uint8_t> act(row_bytes * size_t(tokens));
  for (int64_t t = 0; t < tokens; ++t)
    portable.prepare[size_t(ActKind::Q8)](x.data() + t * cols, act.data() + size_t(t) * row_bytes,
                                          cols);
  for (int64_t first : {int64_t(0), int64_t(3)}) {
    for (int64_t n = 1; n <= 16; ++n) {
      std::vector<uint8_t> expected(lanes8_tile_bytes(cols), 0x5a),
          actual(lanes8_tile_bytes(cols), 0xa5);
      portable.build_tile8(act.data(), row_bytes, first, n, cols, expected.data());
      avx512.build_tile8(act.data(), row_bytes, first, n, cols, actual.data());
      EXPECT_EQ(expected, actual) << "first " << first << " n " << n;
    }
  }
}

// A token's result must not depend on which other tokens share its tile of 16 lanes (a server
// batching requests needs each request's output to be its own): the first tokens of a batch
// give the same bits alone (as few as take this path) and among twenty.
TEST(MatmulLanes, ATokensResultDoesNotDependOnItsCompanions) {
  ThreadPool pool(2);
  const int64_t rows = 24, cols = 512, few = kLanesMinTokens, many = 20;
  for (ActPrecision precision : kPrecisions) {
    for (CpuIsa isa : supported_cpu_isas()) {
      for (DType type : kLanesFormats) {
        const std::vector<uint8_t> weights = make_weights(type, rows, cols, 31);
        const std::vector<float> x = gaussian(size_t(many * cols), 32);
        const std::vector<float> among_many =
            run(isa, type, weights, rows, cols, x, many, pool, precision);
        const std::vector<float> x_few(x.begin(), x.begin() + few * cols);
        const std::vector<float> alone = run(isa, type, weights, rows, cols, x_few, few, pool, precision);
        EXPECT_TRUE(same_bits(alone, std::vector<float>(among_many.begin(),
                                                        among_many.begin() + few * rows)))
            << dtype_name(type) << " " << cpu_isa_name(isa) << " " << precision_name(precision);
      }
    }
  }
}

}  // namespace
}  // namespace tandem::cpu

namespace tandem::cpu {
namespace {

// The tasks cover every row of every matrix once, in order, each inside one matrix and starting
// on a 16-row boundary (interleaved groups); they shrink as the job goes, down to 16 rows at the
// end; one thread gets one task a matrix.
TEST(MatmulTasks, CoverEveryRowOnceLargestFirstOnSixteenRowBoundaries) {
  const std::vector<int64_t> rows = {2048, 0, 1408, 1408, 77, 16, 102400};
  for (int n_threads : {1, 2, 3, 16}) {
    std::vector<RowTask> tasks;
    cut_into_tasks(rows, n_threads, tasks);
    size_t matmul = 0;
    int64_t next = 0;
    for (const RowTask& t : tasks) {
      while (matmul < rows.size() && next == rows[matmul]) ++matmul, next = 0;
      ASSERT_LT(matmul, rows.size()) << n_threads << " threads";
      EXPECT_EQ(t.matmul, matmul);
      EXPECT_EQ(t.first, next);
      EXPECT_GT(t.last, t.first);
      EXPECT_LE(t.last, rows[matmul]);
      EXPECT_EQ(t.first % 16, 0);
      if (n_threads == 1) {
        EXPECT_EQ(t.last - t.first, rows[matmul]);
      }
      next = t.last;
    }
    while (matmul < rows.size() && next == rows[matmul]) ++matmul, next = 0;
    EXPECT_EQ(matmul, rows.size()) << n_threads << " threads: rows left uncovered";
    if (n_threads == 1) continue;
    // The head's tasks (the last matrix, large) start large and shrink to 16 rows.
    std::vector<int64_t> head;
    for (const RowTask& t : tasks)
      if (t.matmul == 6) head.push_back(t.last - t.first);
    ASSERT_GE(head.size(), 2u);
    EXPECT_TRUE(std::is_sorted(head.rbegin(), head.rend())) << n_threads << " threads";
    const int64_t share = 2 * n_threads;
    EXPECT_EQ(head.front(), ((102400 + share - 1) / share + 15) / 16 * 16)
        << n_threads << " threads";
    // A quarter of all that is left, not of one matrix's rows: on two threads the first
    // matrices are taken whole (each is under a quarter of the job).
    if (n_threads == 2) {
      EXPECT_EQ(tasks[0].matmul, 0u);
      EXPECT_EQ(tasks[0].last, 2048);
      EXPECT_EQ(tasks[1].matmul, 2u);
      EXPECT_EQ(tasks[1].last, 1408);
      EXPECT_EQ(tasks[2].matmul, 3u);
      EXPECT_EQ(tasks[2].last, 1408);
    }
    EXPECT_EQ(head.back(), 16) << n_threads << " threads";
  }
}

}  // namespace
}  // namespace tandem::cpu

// Matmuls of tandem's 16-row interleaved formats (Q8_0_R16, Q5_0_R16, Q4_K_R16) on every
// instruction set, precision, kernel choice and token count: against the scalar reference (the
// groups taken apart and dequantized), and against the plain format's matmul on the same weights,
// which they match bit for bit on every path except the AVX-512 group kernels (dot_r16_avx512.cpp
// at Int16, dot_r16_q8_avx512.cpp at Int8): the same integer sums as the plain format's kernels,
// float steps in another order, so within rounding of them. Int8 matmuls on the token-lanes path
// run 8-bit kernels on whole groups (AVX-512) or the plain format's on groups taken apart
// (elsewhere): its bits either way.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cpu/kernels.h"
#include "backends/cpu/matmul.h"
#include "core/error.h"
#include "quant/interleave.h"
#include "quant/quant.h"

namespace tandem::cpu {
namespace {

std::vector<float> gaussian(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = normal(rng);
  return v;
}

struct Weights {
  std::vector<uint8_t> plain;
  std::vector<uint8_t> mixed;  // the same rows interleaved
};

Weights make_weights(DType base, int64_t rows, int64_t cols, uint32_t seed) {
  const DType type = interleaved_format(base);
  const std::vector<float> values = gaussian(rows * cols, seed);
  const size_t stride = row_bytes(base, uint64_t(cols));
  Weights w{std::vector<uint8_t>(size_t(rows) * stride),
            std::vector<uint8_t>(size_t(rows) * row_bytes(type, uint64_t(cols)))};
  for (int64_t r = 0; r < rows; ++r)
    quantize_row(base, values.data() + r * cols, w.plain.data() + size_t(r) * stride, cols);
  const size_t group = 16 * row_bytes(type, uint64_t(cols));
  for (int64_t g = 0; g < rows / 16; ++g)
    interleave_rows(type, w.plain.data() + size_t(g) * 16 * stride, cols, w.mixed.data() + size_t(g) * group);
  return w;
}

std::vector<float> run(CpuIsa isa, DType type, const std::vector<uint8_t>& weights, int64_t rows,
                       int64_t cols, const std::vector<float>& x, int64_t n_tokens,
                       ActPrecision precision, KernelChoice kernels, ThreadPool& pool) {
  std::vector<float> y(size_t(rows * n_tokens), NAN);
  matmul_with_isa(isa,
                  {.weight_type = type,
                   .weights = weights.data(),
                   .rows = rows,
                   .cols = cols,
                   .input = x.data(),
                   .n_tokens = n_tokens,
                   .output = y.data(),
                   .precision = precision,
                   .kernels = kernels},
                  pool);
  return y;
}

// Largest |y - y_ref| / Σ_k |w_k x_k| (as matmul_test.cpp measures), the reference in double
// from the interleaved weights dequantized by src/quant, or `other` where given.
double max_normalized_error(DType type, const std::vector<uint8_t>& weights, int64_t rows,
                            int64_t cols, const std::vector<float>& x, int64_t n_tokens,
                            const std::vector<float>& y,
                            const std::vector<float>* other = nullptr) {
  std::vector<float> w(size_t(rows * cols));
  dequantize_interleaved(type, weights.data(), rows, cols, w.data());
  double worst = 0.0;
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t r = 0; r < rows; ++r) {
      double sum = 0.0, abs_sum = 0.0;
      for (int64_t k = 0; k < cols; ++k) {
        const double p = double(w[size_t(r * cols + k)]) * double(x[size_t(t * cols + k)]);
        sum += p;
        abs_sum += std::fabs(p);
      }
      const double ref = other ? double((*other)[size_t(t * rows + r)]) : sum;
      const double e = std::fabs(double(y[size_t(t * rows + r)]) - ref) / std::max(abs_sum, 1e-30);
      worst = std::max(worst, std::isfinite(e) ? e : INFINITY);
    }
  }
  return worst;
}

// The bounds of matmul_test.cpp for the base formats (32-element formats, k-quants).
double error_bound(DType base, ActPrecision precision) {
  const bool k_quant = dtype_info(base).block_elems == 256;
  if (precision == ActPrecision::Int16) return k_quant ? 3e-5 : 5e-5;
  return k_quant ? 8e-3 : 1e-2;
}

bool uses_row_dots(KernelChoice kernels, int64_t n_tokens, ActPrecision precision) {
  return kernels == KernelChoice::PerToken ||
         (kernels == KernelChoice::ByTokenCount &&
          n_tokens < (precision == ActPrecision::Int8 ? kLanes8MinTokens : kLanesMinTokens));
}

TEST(InterleavedMatmul, MatchesTheReferenceAndThePlainFormat) {
  // The AVX-512 level reads whole groups at both precisions (a group taken apart for the plain
  // kernels would give the plain format's bits and pass the checks below unnoticed).
  if (cpu_supports(CpuIsa::Avx512))
    for (DType base : {DType::Q8_0, DType::Q5_0, DType::Q4_K}) {
      EXPECT_NE(kernel_table(CpuIsa::Avx512).group_dots[size_t(base)], nullptr);
      EXPECT_NE(kernel_table(CpuIsa::Avx512).group_dots8[size_t(base)], nullptr);
    }
  ThreadPool pool(3);
  const int64_t rows = 48;
  int group_kernel_cases = 0;
  for (DType base : {DType::Q8_0, DType::Q5_0, DType::Q4_K}) {
    const DType type = interleaved_format(base);
    for (int64_t cols : {256, 512, 2048}) {
      const Weights w = make_weights(base, rows, cols, uint32_t(cols) + uint32_t(base));
      for (int64_t n_tokens : {1, 3, 6, 8, 17}) {
        const std::vector<float> x = gaussian(n_tokens * cols, uint32_t(7 * cols + n_tokens));
        for (CpuIsa isa : supported_cpu_isas()) {
          for (ActPrecision precision : {ActPrecision::Int16, ActPrecision::Int8}) {
            for (KernelChoice kernels : {KernelChoice::ByTokenCount, KernelChoice::PerToken, KernelChoice::Tiled}) {
              const std::vector<float> mixed =
                  run(isa, type, w.mixed, rows, cols, x, n_tokens, precision, kernels, pool);
              const std::vector<float> plain =
                  run(isa, base, w.plain, rows, cols, x, n_tokens, precision, kernels, pool);
              const std::string where = std::string(dtype_name(type)) + " " + std::string(cpu_isa_name(isa)) +
                                        (precision == ActPrecision::Int16 ? " int16" : " int8") +
                                        " kernels=" + std::to_string(int(kernels)) +
                                        " cols=" + std::to_string(cols) +
                                        " n_tokens=" + std::to_string(n_tokens);
              EXPECT_LE(max_normalized_error(type, w.mixed, rows, cols, x, n_tokens, mixed),
                        error_bound(base, precision))
                  << where;
              const bool group_kernel =
                  isa == CpuIsa::Avx512 && uses_row_dots(kernels, n_tokens, precision);
              group_kernel_cases += group_kernel ? 1 : 0;
              if (!group_kernel) {
                EXPECT_EQ(0, std::memcmp(mixed.data(), plain.data(), mixed.size() * sizeof(float)))
                    << where << ": not the plain format's bits";
              } else {
                // Float rounding apart (~1e-7 of Σ|w x|): far below what the activations'
                // quantization costs, so a wrong integer sum shows.
                EXPECT_LE(
                    max_normalized_error(type, w.mixed, rows, cols, x, n_tokens, mixed, &plain),
                    2e-6)
                    << where << ": not the plain format's integer sums";
              }
            }
          }
        }
      }
    }
  }
  std::printf("  %d cases ran the AVX-512 group kernels\n", group_kernel_cases);
}

// One thread takes all the rows as one task (17 groups): the token-lanes path at either
// precision, on whole groups (AVX-512) or on up to 256 rows taken apart at a time
// (run_interleaved_rows, elsewhere), gives the plain format's bits on every instruction set.
// 768 columns: the AVX-512 8-bit kernel's column chunks of 512 leave a short last one; 40
// tokens: a pair of tiles, then a last one part full.
TEST(InterleavedMatmul, ATaskOfManyGroupsOnTheLanesPathGivesThePlainFormatsBits) {
  ThreadPool pool(1);
  const int64_t rows = 272, cols = 768, n_tokens = 40;
  for (DType base : {DType::Q8_0, DType::Q5_0, DType::Q4_K}) {
    const Weights w = make_weights(base, rows, cols, 21 + uint32_t(base));
    const std::vector<float> x = gaussian(n_tokens * cols, 22);
    for (CpuIsa isa : supported_cpu_isas())
      for (ActPrecision precision : {ActPrecision::Int8, ActPrecision::Int16}) {
        const std::vector<float> mixed = run(isa, interleaved_format(base), w.mixed, rows, cols, x,
                                             n_tokens, precision, KernelChoice::ByTokenCount, pool);
        const std::vector<float> plain = run(isa, base, w.plain, rows, cols, x, n_tokens, precision,
                                             KernelChoice::ByTokenCount, pool);
        EXPECT_EQ(0, std::memcmp(mixed.data(), plain.data(), mixed.size() * sizeof(float)))
            << dtype_name(base) << " " << cpu_isa_name(isa)
            << (precision == ActPrecision::Int8 ? " int8" : " int16");
      }
  }
}

TEST(InterleavedMatmul, RefusesRowsThatAreNotWholeGroups) {
  ThreadPool pool(1);
  const Weights w = make_weights(DType::Q4_K, 32, 256, 5);
  const std::vector<float> x = gaussian(256, 6);
  std::vector<float> y(40);
  try {
    matmul({.weight_type = DType::Q4_K_R16, .weights = w.mixed.data(), .rows = 24, .cols = 256,
            .input = x.data(), .n_tokens = 1, .output = y.data()},
           pool);
    FAIL() << "24 rows of Q4_K_R16 were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("groups of 16"), std::string::npos) << e.what();
  }
}

TEST(InterleavedMatmul, ManyMatricesEachBitIdenticalToItsOwnMatmul) {
  ThreadPool pool(2);
  const int64_t cols = 512;
  const Weights a = make_weights(DType::Q4_K, 64, cols, 11), b = make_weights(DType::Q8_0, 32, cols, 12);
  const std::vector<float> x = gaussian(cols, 13);
  std::vector<float> ya(64), yb(32), plain(32);
  const MatmulArgs args[] = {
      {.weight_type = DType::Q4_K_R16, .weights = a.mixed.data(), .rows = 64, .cols = cols,
       .input = x.data(), .n_tokens = 1, .output = ya.data()},
      {.weight_type = DType::Q8_0_R16, .weights = b.mixed.data(), .rows = 32, .cols = cols,
       .input = x.data(), .n_tokens = 1, .output = yb.data()},
      {.weight_type = DType::Q8_0, .weights = b.plain.data(), .rows = 32, .cols = cols,
       .input = x.data(), .n_tokens = 1, .output = plain.data()}};
  matmul_many(args, pool);
  for (const MatmulArgs& one : args) {
    std::vector<float> alone(size_t(one.rows));
    MatmulArgs single = one;
    single.output = alone.data();
    matmul(single, pool);
    EXPECT_EQ(0, std::memcmp(alone.data(), one.output, alone.size() * sizeof(float)))
        << dtype_name(one.weight_type);
  }
}

}  // namespace
}  // namespace tandem::cpu

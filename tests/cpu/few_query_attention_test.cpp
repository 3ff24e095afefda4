// The few-query attention kernels on every instruction set this CPU has, against double
// sums: all shapes (queries beyond one group of 16 and one block of 4, keys not a multiple of
// the key block, columns not a multiple of 16 or 64), and each result independent of what
// else is in the call.
#include "backends/cpu/few_query_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace tandem::cpu {
namespace {

std::vector<float> random_floats(size_t n, std::mt19937& rng, float low, float high) {
  std::uniform_real_distribution<float> dist(low, high);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// |float sum - exact| <= n * eps * Σ|terms|: the bound of adding n products in order; the exact
// sum of term(0) .. term(n - 1) in double.
template <class Term>
void expect_near_sum(double got, int64_t n, Term term, const std::string& where) {
  double exact = 0, abs_terms = 0;
  for (int64_t i = 0; i < n; ++i) exact += term(i), abs_terms += std::abs(term(i));
  EXPECT_LE(std::abs(got - exact), double(n + 1) * 1.2e-7 * abs_terms + 1e-30) << where;
}

TEST(FewQueryAttention, KeyScoresMatchDoubleSums) {
  std::mt19937 rng(7);
  ThreadPool pool(3);
  for (CpuIsa isa : supported_cpu_isas()) {
    for (int64_t n_queries : {1, 5, 16, 21}) {
      for (int64_t n_keys : {0, 1, 7, 8, 67, 130}) {
        for (int64_t cols : {1, 24, 72}) {
          const int64_t x_stride = cols + 3, key_stride = cols + 5, score_stride = n_keys + 2;
          const std::vector<float> x = random_floats(size_t(n_queries * x_stride), rng, -1, 1);
          const std::vector<float> keys = random_floats(size_t(std::max<int64_t>(n_keys, 1) * key_stride), rng, -1, 1);
          std::vector<float> scores(size_t(n_queries * score_stride), -7.0f);
          key_scores_with_isa(isa, {.x = x.data(), .x_stride = x_stride, .n_queries = n_queries, .keys = keys.data(),
                                    .key_stride = key_stride, .n_keys = n_keys, .cols = cols,
                                    .scores = scores.data(), .score_stride = score_stride},
                              pool);
          for (int64_t q = 0; q < n_queries; ++q) {
            for (int64_t j = 0; j < n_keys; ++j)
              expect_near_sum(
                  scores[q * score_stride + j], cols,
                  [&](int64_t c) { return double(x[q * x_stride + c]) * keys[j * key_stride + c]; },
                  std::string(cpu_isa_name(isa)) + " q " + std::to_string(q) + " key " + std::to_string(j) + " of " +
                      std::to_string(n_keys) + " cols " + std::to_string(cols));
            for (int64_t j = n_keys; j < score_stride; ++j) EXPECT_EQ(scores[q * score_stride + j], -7.0f);  // untouched
          }
        }
      }
    }
  }
}

TEST(FewQueryAttention, WeightedSumsMatchDoubleSums) {
  std::mt19937 rng(11);
  ThreadPool pool(2);
  for (CpuIsa isa : supported_cpu_isas()) {
    for (int64_t n_queries : {1, 3, 4, 16, 18}) {
      for (int64_t keys : {0, 1, 9, 100}) {
        for (int64_t n : {5, 64, 100, 512}) {
          const int64_t p_stride = keys + 4, row_stride = n + 7, out_stride = n + 9;
          const std::vector<float> p = random_floats(size_t(n_queries * p_stride), rng, 0, 1);
          const std::vector<float> rows = random_floats(size_t(std::max<int64_t>(keys, 1) * row_stride), rng, -1, 1);
          std::vector<float> out(size_t(n_queries * out_stride), -7.0f);
          weighted_sums_with_isa(isa, {.p = p.data(), .p_stride = p_stride, .n_queries = n_queries, .rows = rows.data(),
                                       .row_stride = row_stride, .keys = keys, .n = n, .out = out.data(),
                                       .out_stride = out_stride},
                                 pool);
          for (int64_t q = 0; q < n_queries; ++q) {
            for (int64_t c = 0; c < n; ++c)
              expect_near_sum(
                  out[q * out_stride + c], keys,
                  [&](int64_t j) { return double(p[q * p_stride + j]) * rows[j * row_stride + c]; },
                  std::string(cpu_isa_name(isa)) + " q " + std::to_string(q) + " col " + std::to_string(c));
            for (int64_t c = n; c < out_stride; ++c) EXPECT_EQ(out[q * out_stride + c], -7.0f);  // untouched
          }
        }
      }
    }
  }
}

// A query's scores and sums are the same bits alone as among others (batch invariance for the
// decode steps of a batch: each sequence's heads run together, whatever else is in the step).
TEST(FewQueryAttention, AQuerysResultsDoNotDependOnItsCallMates) {
  std::mt19937 rng(3);
  ThreadPool pool(2);
  const int64_t n_queries = 19, n_keys = 45, cols = 40;
  const std::vector<float> x = random_floats(size_t(n_queries * cols), rng, -1, 1);
  const std::vector<float> keys = random_floats(size_t(n_keys * cols), rng, -1, 1);
  const std::vector<float> p = random_floats(size_t(n_queries * n_keys), rng, 0, 1);
  for (CpuIsa isa : supported_cpu_isas()) {
    std::vector<float> all_scores(size_t(n_queries * n_keys)), all_sums(size_t(n_queries * cols));
    key_scores_with_isa(isa, {.x = x.data(), .x_stride = cols, .n_queries = n_queries, .keys = keys.data(),
                              .key_stride = cols, .n_keys = n_keys, .cols = cols, .scores = all_scores.data(),
                              .score_stride = n_keys},
                        pool);
    weighted_sums_with_isa(isa, {.p = p.data(), .p_stride = n_keys, .n_queries = n_queries, .rows = keys.data(),
                                 .row_stride = cols, .keys = n_keys, .n = cols, .out = all_sums.data(),
                                 .out_stride = cols},
                           pool);
    for (int64_t q : {0, 6, 17}) {
      std::vector<float> scores(static_cast<size_t>(n_keys)), sums(static_cast<size_t>(cols));
      key_scores_with_isa(isa, {.x = x.data() + q * cols, .x_stride = cols, .n_queries = 1, .keys = keys.data(),
                                .key_stride = cols, .n_keys = n_keys, .cols = cols, .scores = scores.data(),
                                .score_stride = n_keys},
                          pool);
      weighted_sums_with_isa(isa, {.p = p.data() + q * n_keys, .p_stride = n_keys, .n_queries = 1,
                                   .rows = keys.data(), .row_stride = cols, .keys = n_keys, .n = cols,
                                   .out = sums.data(), .out_stride = cols},
                             pool);
      for (int64_t j = 0; j < n_keys; ++j)
        EXPECT_EQ(scores[size_t(j)], all_scores[size_t(q * n_keys + j)]) << cpu_isa_name(isa) << " q " << q << " key " << j;
      for (int64_t c = 0; c < cols; ++c)
        EXPECT_EQ(sums[size_t(c)], all_sums[size_t(q * cols + c)]) << cpu_isa_name(isa) << " q " << q << " col " << c;
    }
  }
}

}  // namespace
}  // namespace tandem::cpu

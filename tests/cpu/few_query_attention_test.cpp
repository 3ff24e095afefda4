// The few-query attention kernels on every instruction set this CPU has, against double
// sums: all shapes (queries beyond one group of 16 and one block of 4, keys not a multiple of
// the key block, columns not a multiple of 16 or 64), and each result independent of what
// else is in the call.
#include "backends/cpu/few_query_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "backends/cpu/kernels.h"
#include "core/half.h"
#include "cpu/sum_bound.h"

namespace tandem::cpu {
namespace {

std::vector<float> random_floats(size_t n, std::mt19937& rng, float low, float high) {
  std::uniform_real_distribution<float> dist(low, high);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(FewQueryAttention, KeyScoresMatchDoubleSums) {
  std::mt19937 rng(7);
  ThreadPool pool(3);
  for (CpuIsa isa : supported_cpu_isas()) {
    for (int64_t n_queries : {1, 5, 16, 21}) {
      for (int64_t n_keys : {0, 1, 7, 8, 25, 67, 130}) {  // 25: the 16-, 8- and 1-key loops
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

// Softmax attention of each (token, head) over keys 0 .. last_key[t], in double.
std::vector<double> exact_attention(const std::vector<float>& x, int64_t heads, const std::vector<int32_t>& last_key,
                                    const std::vector<float>& keys, int64_t cols, int64_t n_out, float scale) {
  std::vector<double> out;
  for (size_t t = 0; t < last_key.size(); ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const float* q = x.data() + (int64_t(t) * heads + h) * cols;
      std::vector<double> s(size_t(last_key[t] + 1));
      double top = -INFINITY, total = 0;
      for (size_t j = 0; j < s.size(); ++j) {
        for (int64_t c = 0; c < cols; ++c) s[j] += double(q[c]) * keys[j * size_t(cols) + size_t(c)];
        top = std::max(top, s[j] *= scale);
      }
      for (double& v : s) total += v = std::exp(v - top);
      for (int64_t c = 0; c < n_out; ++c) {
        double sum = 0;
        for (size_t j = 0; j < s.size(); ++j) sum += s[j] / total * keys[j * size_t(cols) + size_t(c)];
        out.push_back(sum);
      }
    }
  return out;
}

// Contexts inside one block, at its edge, across blocks and across parts of several blocks
// (kAttendBlock keys a block, parts of 512 keys past 1024, the last part one key), tokens of one
// call with different lengths.
TEST(FewQueryAttention, AttendMatchesExactSoftmaxAttention) {
  std::mt19937 rng(5);
  ThreadPool pool(3);
  const int64_t cols = 72, n_out = 64;
  constexpr int32_t B = int32_t(kAttendBlock);
  const std::vector<int32_t> last_key = {0, B - 2, B - 1, B, 600, 1100, 8 * B - 1, 8 * B};
  const std::vector<float> keys = random_floats(size_t((8 * B + 1) * cols), rng, -1, 1);
  for (int64_t heads : {1, 16, 20}) {
    // Scores of a few units: the softmax is neither flat nor one-hot.
    const std::vector<float> x = random_floats(size_t(int64_t(last_key.size()) * heads * cols), rng, -1, 1);
    const float scale = 0.3f;
    const std::vector<double> exact = exact_attention(x, heads, last_key, keys, cols, n_out, scale);
    for (CpuIsa isa : supported_cpu_isas()) {
      const int64_t out_token_stride = heads * (n_out + 3), out_head_stride = n_out + 3;
      std::vector<float> out(size_t(int64_t(last_key.size()) * out_token_stride), -7.0f);
      attend_with_isa(isa, {.x = x.data(), .x_stride = cols, .n_tokens = int64_t(last_key.size()), .heads = heads,
                            .last_key = last_key.data(), .keys = keys.data(), .key_stride = cols, .cols = cols,
                            .n_out = n_out, .scale = scale, .out = out.data(), .out_token_stride = out_token_stride,
                            .out_head_stride = out_head_stride},
                      pool);
      for (size_t t = 0; t < last_key.size(); ++t)
        for (int64_t h = 0; h < heads; ++h) {
          for (int64_t c = 0; c < n_out; ++c) {
            // A convex combination of values in [-1, 1], each weight with a few roundings.
            const double got = out[t * size_t(out_token_stride) + size_t(h * out_head_stride + c)];
            EXPECT_NEAR(got, exact[(t * size_t(heads) + size_t(h)) * size_t(n_out) + size_t(c)], 2e-6)
                << cpu_isa_name(isa) << " heads " << heads << " token " << t << " (" << last_key[t] + 1 << " keys) head " << h << " col " << c;
          }
          for (int64_t c = n_out; c < out_head_stride; ++c)  // nothing written past n_out
            EXPECT_EQ(out[t * size_t(out_token_stride) + size_t(h * out_head_stride + c)], -7.0f);
        }
    }
  }
}

TEST(FewQueryAttention, AttendGivesATokenTheSameBitsAloneAndAmongOthers) {
  std::mt19937 rng(9);
  ThreadPool pool(2);
  const int64_t cols = 40, heads = 3;
  const std::vector<int32_t> last_key = {700, 5, 1500, int32_t(kAttendBlock) + 2};
  const std::vector<float> keys = random_floats(size_t(1501 * cols), rng, -1, 1);
  const std::vector<float> x = random_floats(size_t(int64_t(last_key.size()) * heads * cols), rng, -1, 1);
  for (CpuIsa isa : supported_cpu_isas()) {
    std::vector<float> all(last_key.size() * size_t(heads * cols));
    attend_with_isa(isa, {.x = x.data(), .x_stride = cols, .n_tokens = int64_t(last_key.size()), .heads = heads,
                          .last_key = last_key.data(), .keys = keys.data(), .key_stride = cols, .cols = cols,
                          .n_out = cols, .scale = 0.5f, .out = all.data(), .out_token_stride = heads * cols,
                          .out_head_stride = cols},
                    pool);
    for (size_t t = 0; t < last_key.size(); ++t) {
      std::vector<float> alone(size_t(heads * cols));
      attend_with_isa(isa, {.x = x.data() + t * size_t(heads * cols), .x_stride = cols, .n_tokens = 1, .heads = heads,
                            .last_key = &last_key[t], .keys = keys.data(), .key_stride = cols, .cols = cols,
                            .n_out = cols, .scale = 0.5f, .out = alone.data(), .out_token_stride = heads * cols,
                            .out_head_stride = cols},
                      pool);
      for (size_t i = 0; i < alone.size(); ++i)
        ASSERT_EQ(alone[i], all[t * alone.size() + i]) << cpu_isa_name(isa) << " token " << t << " value " << i;
    }
  }
}

// The softmax terms of one block (attend's inner step) on every level against double exp: the
// running top exact (a max of the same products), each term within a few float roundings (the
// AVX-512 level has its own exp) of exp of the rounded difference, the sum within the rounding
// of adding the terms. Scores reach far below the top, down to where the terms become denormal.
TEST(FewQueryAttention, SoftmaxBlockMatchesDoubleExp) {
  std::mt19937 rng(11);
  for (CpuIsa isa : supported_cpu_isas()) {
    const KernelTable& table = kernel_table(isa);
    for (int64_t n : {1, 5, 16, 17, 128}) {
      for (float top_before : {-INFINITY, 3.0f, 40.0f}) {
        std::vector<float> s = random_floats(size_t(n), rng, -80, 10);
        const std::vector<float> raw = s;
        float top = top_before;
        // With bf16 weights asked for (but for one top): each term's f32_to_bf16, nothing past n.
        const bool with_weights = top_before != 3.0f;
        std::vector<uint16_t> weights16(size_t(n) + 16, 0x5555);
        const float sum = table.softmax_block(s.data(), n, 0.75f, &top,
                                              with_weights ? weights16.data() : nullptr);
        float expected_top = top_before;
        for (float v : raw) expected_top = std::max(expected_top, v * 0.75f);
        const std::string where = std::string(cpu_isa_name(isa)) + " n " + std::to_string(n);
        ASSERT_EQ(top, expected_top) << where;
        double exact_sum = 0;
        for (int64_t j = 0; j < n; ++j) {
          const float argument = raw[size_t(j)] * 0.75f - expected_top;  // as the kernels round it
          const double e = std::exp(double(argument));
          exact_sum += e;
          EXPECT_NEAR(s[size_t(j)], e, 4e-7 * e + 1e-40) << where << " j " << j;
        }
        EXPECT_NEAR(sum, exact_sum, double(n + 4) * 1.2e-7 * exact_sum + 1e-40) << where;
        for (int64_t j = 0; j < n + 16; ++j) {
          const uint16_t expected = with_weights && j < n ? f32_to_bf16(s[size_t(j)]) : 0x5555;
          ASSERT_EQ(weights16[size_t(j)], expected) << where << " weight " << j;
        }
      }
    }
  }
}

// A NaN score (a broken model or input) makes the block's terms and sum NaN on every level, as
// the C library's exp does, so it shows in the output instead of becoming a zero weight.
TEST(FewQueryAttention, SoftmaxBlockKeepsNan) {
  for (CpuIsa isa : supported_cpu_isas()) {
    std::vector<float> s = {1.0f, 2.0f, NAN, 0.5f, 3.0f};
    std::vector<uint16_t> weights16(s.size());
    float top = -INFINITY;
    const float sum =
        kernel_table(isa).softmax_block(s.data(), int64_t(s.size()), 1.0f, &top, weights16.data());
    EXPECT_TRUE(std::isnan(sum)) << cpu_isa_name(isa);
    EXPECT_TRUE(std::isnan(s[2])) << cpu_isa_name(isa);
    for (size_t j = 0; j < s.size(); ++j)
      EXPECT_EQ(weights16[j], f32_to_bf16(s[j])) << cpu_isa_name(isa) << " weight " << j;
  }
}

// A part's sums rescaled and the next block's added: the multiply and the add rounded apart on
// every level (a fused multiply-add would differ in the last bit), nothing written past n.
TEST(FewQueryAttention, ScaleAddRoundsTheProductAndTheSumApart) {
  std::mt19937 rng(12);
  for (CpuIsa isa : supported_cpu_isas())
    for (int64_t n : {1, 15, 16, 64, 70}) {
      const std::vector<float> before = random_floats(size_t(n) + 5, rng, -3, 3);
      const std::vector<float> in = random_floats(size_t(n), rng, -3, 3);
      const float scale = 0.318f;
      std::vector<float> out = before;
      kernel_table(isa).scale_add(out.data(), in.data(), scale, n);
      for (int64_t i = 0; i < n + 5; ++i) {
        float expected = before[size_t(i)];
        if (i < n) {
          volatile float scaled = before[size_t(i)] * scale;  // rounded here, not fused below
          expected = scaled + in[size_t(i)];
        }
        ASSERT_EQ(out[size_t(i)], expected) << cpu_isa_name(isa) << " n " << n << " i " << i;
      }
    }
}

}  // namespace
}  // namespace tandem::cpu

// Attention over a BF16 KV cache (--cache-type-k/v bf16): the two bf16 kernels on every
// instruction set this CPU has against double sums of the same bf16 products, odd key counts and
// narrow column slices included (the word after an odd last weight and the row after the last key
// hold NaN: neither may be read); attend() over bf16 keys and values against exact attention of
// the rounded values; and a token's result the same alone and among others.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/few_query_attention.h"
#include "backends/cpu/kernels.h"
#include "core/half.h"
#include "cpu/sum_bound.h"

namespace tandem::cpu {
namespace {

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float low, float high) {
  std::uniform_real_distribution<float> dist(low, high);
  std::vector<uint16_t> v(n);
  for (uint16_t& x : v) x = f32_to_bf16(dist(rng));
  return v;
}

constexpr uint16_t kNanBf16 = 0x7fc0;

TEST(Bf16Attention, KeyScoresMatchDoubleSumsOfTheBf16Products) {
  std::mt19937 rng(3);
  for (CpuIsa isa : supported_cpu_isas()) {
    const KernelTable& table = kernel_table(isa);
    for (int n_queries : {1, 5, 16}) {
      for (int64_t n_keys : {0, 1, 3, 4, 5, 17, 25, 130}) {  // the 16-, 4- and 1-key loops
        for (int64_t cols : {2, 24, 72, 576}) {
          const int64_t key_stride = cols + 6, score_stride = n_keys + 2;
          // Query q's columns 2i, 2i + 1 at x_p[32 i + 2 q], [32 i + 2 q + 1]; lanes past
          // n_queries NaN (their scores are not written).
          std::vector<uint16_t> x_p(size_t(cols * 16), kNanBf16);
          const std::vector<uint16_t> x = random_bf16(size_t(n_queries * cols), rng, -1, 1);
          for (int q = 0; q < n_queries; ++q)
            for (int64_t c = 0; c < cols; ++c)
              x_p[size_t((c / 2) * 32 + 2 * q + c % 2)] = x[size_t(q * cols + c)];
          const std::vector<uint16_t> keys =
              random_bf16(size_t(std::max<int64_t>(n_keys, 1) * key_stride), rng, -1, 1);
          std::vector<float> scores(size_t(n_queries * score_stride), -7.0f);
          table.key_scores_16_bf16(x_p.data(), n_queries, keys.data(), key_stride, n_keys, cols,
                                   scores.data(), score_stride);
          for (int q = 0; q < n_queries; ++q) {
            for (int64_t j = 0; j < n_keys; ++j)
              expect_near_sum(
                  scores[size_t(q * score_stride + j)], cols,
                  [&](int64_t c) {
                    return double(bf16_to_f32(x[size_t(q * cols + c)])) *
                           bf16_to_f32(keys[size_t(j * key_stride + c)]);
                  },
                  std::string(cpu_isa_name(isa)) + " q " + std::to_string(q) + " key " +
                      std::to_string(j) + " of " + std::to_string(n_keys) + " cols " +
                      std::to_string(cols));
            for (int64_t j = n_keys; j < score_stride; ++j)
              EXPECT_EQ(scores[size_t(q * score_stride + j)], -7.0f);
          }
        }
      }
    }
  }
}

TEST(Bf16Attention, WeightedSumsMatchDoubleSumsOfTheBf16Products) {
  std::mt19937 rng(4);
  for (CpuIsa isa : supported_cpu_isas()) {
    const KernelTable& table = kernel_table(isa);
    for (int n_queries : {1, 2, 3, 4}) {
      for (int64_t keys : {0, 1, 2, 9, 100, 129}) {
        for (int cols : {5, 16, 32, 33, 64}) {
          const int64_t row_stride = 64 + 8;
          std::vector<uint16_t> rows = random_bf16(size_t((keys + 1) * row_stride), rng, -1, 1);
          std::fill(rows.begin() + keys * row_stride, rows.end(),
                    kNanBf16);  // the row after the last
          std::vector<std::vector<uint16_t>> p{size_t(n_queries)};
          for (auto& w : p) {
            w = random_bf16(size_t(keys + 1), rng, 0, 1);
            w[size_t(keys)] = kNanBf16;  // after the last weight
          }
          std::vector<std::vector<float>> out(size_t(n_queries), std::vector<float>(72, -7.0f));
          const uint16_t* p_ptrs[4];
          float* out_ptrs[4];
          for (int q = 0; q < n_queries; ++q)
            p_ptrs[q] = p[size_t(q)].data(), out_ptrs[q] = out[size_t(q)].data();
          table.weighted_sums_64_bf16(p_ptrs, n_queries, rows.data(), row_stride, keys, cols,
                                      out_ptrs);
          for (int q = 0; q < n_queries; ++q) {
            for (int c = 0; c < cols; ++c)
              expect_near_sum(
                  out[size_t(q)][size_t(c)], keys,
                  [&](int64_t j) {
                    return double(bf16_to_f32(p[size_t(q)][size_t(j)])) *
                           bf16_to_f32(rows[size_t(j * row_stride + c)]);
                  },
                  std::string(cpu_isa_name(isa)) + " q " + std::to_string(q) + " col " +
                      std::to_string(c) + " of " + std::to_string(cols) + " keys " +
                      std::to_string(keys));
            for (int c = cols; c < 72; ++c)
              EXPECT_EQ(out[size_t(q)][size_t(c)], -7.0f);  // not written
          }
        }
      }
    }
  }
}

// Grouped-query attention (two kv groups, keys and values in one row, as a KV cache holds them)
// over bf16 rows, against exact softmax attention of the rounded queries, keys and values. The
// kernels round each softmax weight to bf16 too: up to 2^-9 of each weight, so a few 1e-3 of a
// value in [-1, 1].
TEST(Bf16Attention, AttendMatchesExactAttentionOfTheRoundedValues) {
  std::mt19937 rng(6);
  ThreadPool pool(3);
  const int64_t groups = 2, per_group = 8, heads = groups * per_group, head_dim = 64;
  const int64_t row = 2 * groups * head_dim;  // every group's key, then every group's value
  constexpr int32_t B = int32_t(kAttendBlock);
  const std::vector<int32_t> last_key = {0, 1, B - 2, B - 1, B, 600, 1100, 2048};
  const std::vector<uint16_t> cache = random_bf16(size_t(2049 * row), rng, -1, 1);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> x(last_key.size() * size_t(heads * head_dim));
  for (float& v : x) v = dist(rng);
  const float scale = 0.3f;
  for (CpuIsa isa : supported_cpu_isas()) {
    std::vector<float> out(x.size(), -7.0f);
    attend_with_isa(isa,
                    {.x = x.data(),
                     .x_stride = head_dim,
                     .n_tokens = int64_t(last_key.size()),
                     .heads = heads,
                     .last_key = last_key.data(),
                     .keys = cache.data(),
                     .key_stride = row,
                     .cols = head_dim,
                     .n_out = head_dim,
                     .scale = scale,
                     .out = out.data(),
                     .out_token_stride = heads * head_dim,
                     .out_head_stride = head_dim,
                     .kv_groups = groups,
                     .key_group_offset = head_dim,
                     .values = cache.data() + groups * head_dim,
                     .value_stride = row,
                     .value_group_offset = head_dim,
                     .cache_type = DType::BF16},
                    pool);
    for (size_t t = 0; t < last_key.size(); ++t)
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t g = h / per_group;
        const float* q = x.data() + (int64_t(t) * heads + h) * head_dim;
        std::vector<double> s(size_t(last_key[t] + 1));
        double top = -INFINITY, total = 0;
        for (size_t j = 0; j < s.size(); ++j) {
          for (int64_t c = 0; c < head_dim; ++c)
            s[j] += double(bf16_to_f32(f32_to_bf16(q[c]))) *
                    bf16_to_f32(cache[j * size_t(row) + size_t(g * head_dim + c)]);
          top = std::max(top, s[j] *= scale);
        }
        for (double& v : s) total += v = std::exp(v - top);
        for (int64_t c = 0; c < head_dim; ++c) {
          double exact = 0;
          for (size_t j = 0; j < s.size(); ++j)
            exact += s[j] / total *
                     bf16_to_f32(cache[j * size_t(row) + size_t((groups + g) * head_dim + c)]);
          EXPECT_NEAR(out[(t * size_t(heads) + size_t(h)) * size_t(head_dim) + size_t(c)], exact,
                      4e-3)
              << cpu_isa_name(isa) << " token " << t << " (" << last_key[t] + 1 << " keys) head "
              << h << " col " << c;
        }
      }
  }
}

TEST(Bf16Attention, AttendGivesATokenTheSameBitsAloneAndAmongOthers) {
  std::mt19937 rng(8);
  ThreadPool pool(2);
  const int64_t cols = 40, heads = 3;
  const std::vector<int32_t> last_key = {700, 5, 1500, int32_t(kAttendBlock) + 2};
  const std::vector<uint16_t> keys = random_bf16(size_t(1501 * cols), rng, -1, 1);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> x(last_key.size() * size_t(heads * cols));
  for (float& v : x) v = dist(rng);
  for (CpuIsa isa : supported_cpu_isas()) {
    auto run = [&](size_t first, size_t n, float* out) {
      attend_with_isa(isa,
                      {.x = x.data() + first * size_t(heads * cols),
                       .x_stride = cols,
                       .n_tokens = int64_t(n),
                       .heads = heads,
                       .last_key = &last_key[first],
                       .keys = keys.data(),
                       .key_stride = cols,
                       .cols = cols,
                       .n_out = cols,
                       .scale = 0.5f,
                       .out = out,
                       .out_token_stride = heads * cols,
                       .out_head_stride = cols,
                       .cache_type = DType::BF16},
                      pool);
    };
    std::vector<float> all(x.size());
    run(0, last_key.size(), all.data());
    for (size_t t = 0; t < last_key.size(); ++t) {
      std::vector<float> alone(size_t(heads * cols));
      run(t, 1, alone.data());
      for (size_t i = 0; i < alone.size(); ++i)
        ASSERT_EQ(alone[i], all[t * alone.size() + i])
            << cpu_isa_name(isa) << " token " << t << " value " << i;
    }
  }
}

}  // namespace
}  // namespace tandem::cpu

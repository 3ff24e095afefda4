// The 8-bit-activation steps of quant/block_dot_q8.h (the GPU's decode step for the feed-forward
// products) against the scalar reference: each row dequantized by dequantize_row and dotted in
// double with the activations as quantize_act32 left them (d · q), so every unpacked bit, scale
// and offset is checked to F32 rounding; and the activation quantization itself.
#include "quant/block_dot_q8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "quant/quant.h"
#include "test_weights.h"

namespace tandem {
namespace {

constexpr DType kFormats[] = {DType::Q4_0, DType::Q5_0,   DType::Q5_1,  DType::Q8_0,  DType::Q4_K,
                              DType::Q5_K, DType::Q6_K,   DType::IQ4_NL, DType::IQ4_XS};

std::vector<blocks::ActQ8> quantize_activations(const std::vector<float>& x) {
  std::vector<blocks::ActQ8> out(x.size() / 32);
  for (size_t b = 0; b < out.size(); ++b) blocks::quantize_act32(x.data() + 32 * b, out[b]);
  return out;
}

float quant_of(const blocks::ActQ8& block, int i) {
  return float(int8_t(block.qs[i / 4] >> (8 * (i % 4))));
}

TEST(BlockDotQ8, activations_round_to_127_steps_of_the_largest_with_their_sum) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(32 * 64);
  for (float& v : x) v = normal(rng);
  for (int i = 0; i < 32; ++i) x[size_t(i)] = 0.0f;  // an all-zero block: d = 0, every q = 0
  const std::vector<blocks::ActQ8> q = quantize_activations(x);
  for (size_t b = 0; b < q.size(); ++b) {
    float amax = 0;
    int32_t sum = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[32 * b + size_t(i)]));
    EXPECT_EQ(q[b].d, amax / 127.0f);
    for (int i = 0; i < 32; ++i) {
      const float v = quant_of(q[b], i);
      sum += int32_t(v);
      EXPECT_LE(std::fabs(v), 127.0f);
      if (q[b].d > 0) EXPECT_LE(std::fabs(v * q[b].d - x[32 * b + size_t(i)]), 0.5001f * q[b].d);
      else EXPECT_EQ(v, 0.0f);
    }
    EXPECT_EQ(q[b].sum, sum) << "block " << b;
  }
}

TEST(BlockDotQ8, dot32_q8_matches_the_dequantized_row_within_f32_rounding) {
  for (const DType type : kFormats) {
    const int64_t n = dtype_info(type).block_elems == 256 ? 4 * 256 : 8 * 32;
    for (uint32_t seed = 1; seed <= 4; ++seed) {
      const std::vector<uint8_t> row = test::make_weights(type, 1, n, seed);
      std::vector<float> w(static_cast<size_t>(n));
      dequantize_row(type, row.data(), w.data(), n);
      std::mt19937 rng(seed * 13);
      std::normal_distribution<float> normal(0.0f, seed == 4 ? 1e3f : 1.0f);
      std::vector<float> x(static_cast<size_t>(n));
      for (float& v : x) v = normal(rng);
      const std::vector<blocks::ActQ8> xq = quantize_activations(x);
      double exact = 0, magnitude = 0;
      for (int64_t i = 0; i < n; ++i) {
        const blocks::ActQ8& block = xq[size_t(i / 32)];
        const double xi = double(block.d) * quant_of(block, int(i % 32));
        exact += double(w[size_t(i)]) * xi, magnitude += std::fabs(double(w[size_t(i)]) * xi);
      }
      float acc[2] = {0.0f, 0.0f};  // the same token twice: a token's sum is its own
      const bool known = blocks::visit_block_dot_q8(type, [&](auto decoder, auto dot) {
        using Dec = decltype(decoder);
        using Dot = decltype(dot);
        constexpr int kChunks = Dec::kElems / 32;
        for (int64_t c = 0; c < n / 32; ++c) {
          blocks::Quants32 q;
          Dot::quants32(row.data() + (c / kChunks) * Dec::kBytes, int(c % kChunks), q);
          const blocks::ActQ8* xs[2] = {&xq[size_t(c)], &xq[size_t(c)]};
          blocks::dot32_q8<Dec::kType, 2>(q, xs, acc);
        }
      });
      ASSERT_TRUE(known) << dtype_name(type);
      // F32 steps per group of 16 or 32 on exact integer sums: a few 2^-24 of Σ|w·x| at most. A
      // wrong bit, nibble, scale or offset costs 1e-3 or more.
      const double error = std::fabs(double(acc[0]) - exact) / magnitude;
      EXPECT_LT(error, 2e-6) << dtype_name(type) << " seed " << seed << ": " << acc[0] << " vs "
                             << exact;
      EXPECT_EQ(acc[0], acc[1]) << dtype_name(type);
    }
  }
}

TEST(BlockDotQ8, the_formats_without_an_8_bit_step_say_so) {
  for (const DType type : kFormats)
    EXPECT_TRUE(blocks::visit_block_dot_q8(type, [](auto, auto) {})) << dtype_name(type);
  for (const DType type : {DType::F32, DType::F16, DType::BF16, DType::Q2_K, DType::Q3_K})
    EXPECT_FALSE(blocks::visit_block_dot_q8(type, [](auto, auto) {})) << dtype_name(type);
}

}  // namespace
}  // namespace tandem

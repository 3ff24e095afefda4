// The 32-weight dot products of quant/block_dot.h (the GPU decode kernel's inner step) against
// the scalar reference: each row dequantized by dequantize_row and dotted in double. And a token's
// result does not depend on the tokens computed beside it (the GPU's batch invariance).
#include "quant/block_dot.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "quant/quant.h"
#include "test_weights.h"

namespace tandem {
namespace {

constexpr DType kFormats[] = {DType::Q4_0, DType::Q5_0, DType::Q5_1,   DType::Q8_0,
                              DType::Q2_K, DType::Q3_K, DType::Q4_K,   DType::Q5_K,
                              DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS, DType::Q4_1,
                              DType::MXFP4, DType::TQ1_0, DType::TQ2_0, DType::IQ1_S,
                              DType::IQ1_M, DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S,
                              DType::IQ3_XXS, DType::IQ3_S};

// acc[t] for the whole row, chunk by chunk in order, as a kernel lane would (here one lane does
// all the chunks; on the GPU lanes take every 32nd and a shuffle tree sums them).
template <int NT>
void row_dots(DType type, const uint8_t* row, int64_t n, const float* const (&x)[NT],
              float (&acc)[NT]) {
  for (float& a : acc) a = 0.0f;
  const bool known = blocks::visit_block_dot(type, [&](auto decoder, auto dot) {
    using Dec = decltype(decoder);
    using Dot = decltype(dot);
    constexpr int kChunks = Dot::kChunks;
    for (int64_t c = 0; c < n / 32; ++c) {
      const float* xs[NT];
      for (int t = 0; t < NT; ++t) xs[t] = x[t] + 32 * c;
      Dot::template dot32<NT>(row + (c / kChunks) * Dec::kBytes, int(c % kChunks), xs, acc);
    }
  });
  ASSERT_TRUE(known) << dtype_name(type);
}

TEST(BlockDot, dot32_matches_the_dequantized_row_within_f32_rounding) {
  for (const DType type : kFormats) {
    const int64_t n = dtype_info(type).block_elems == 256 ? 4 * 256 : 4 * 32;
    for (uint32_t seed = 1; seed <= 4; ++seed) {
      const std::vector<uint8_t> row = test::make_weights(type, 1, n, seed);
      std::vector<float> w(static_cast<size_t>(n));
      dequantize_row(type, row.data(), w.data(), n);
      std::mt19937 rng(seed * 7);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> x(static_cast<size_t>(n));
      for (float& v : x) v = normal(rng) * (seed == 4 ? 1e3f : 1.0f);
      double exact = 0, magnitude = 0;
      for (int64_t i = 0; i < n; ++i)
        exact += double(w[size_t(i)]) * x[size_t(i)],
            magnitude += std::fabs(double(w[size_t(i)]) * x[size_t(i)]);
      const float* xs[1] = {x.data()};
      float acc[1];
      row_dots<1>(type, row.data(), n, xs, acc);
      // F32 sums of at most n terms, and the factored scale and min (d·Σqx − m·Σx), whose two sums
      // each round on the scale of Σ|terms|: a few n·2^-24 relative to Σ|w·x|. A wrong bit, nibble,
      // scale or min costs 1e-2 or more.
      const double error = std::fabs(double(acc[0]) - exact) / magnitude;
      EXPECT_LT(error, 2e-5) << dtype_name(type) << " seed " << seed << ": " << acc[0] << " vs "
                             << exact;
    }
  }
}

TEST(BlockDot, a_tokens_result_is_the_same_alone_and_beside_others) {
  for (const DType type : kFormats) {
    const int64_t n = dtype_info(type).block_elems == 256 ? 2 * 256 : 2 * 32;
    const std::vector<uint8_t> row = test::make_weights(type, 1, n, 11);
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(3 * n));
    for (float& v : x) v = normal(rng);
    const float* three[3] = {x.data(), x.data() + n, x.data() + 2 * n};
    float together[3];
    row_dots<3>(type, row.data(), n, three, together);
    for (int t = 0; t < 3; ++t) {
      const float* one[1] = {three[t]};
      float alone[1];
      row_dots<1>(type, row.data(), n, one, alone);
      EXPECT_EQ(std::memcmp(&alone[0], &together[t], sizeof(float)), 0)
          << dtype_name(type) << " token " << t;
    }
  }
}

TEST(BlockDot, every_quantized_decoder_has_a_32_weight_step_and_the_float_formats_do_not) {
  for (const DType type : kFormats)
    EXPECT_TRUE(blocks::visit_block_dot(type, [](auto, auto) {})) << dtype_name(type);
  for (const DType type : {DType::F32, DType::F16, DType::BF16, DType::Q4_K_R16})
    EXPECT_FALSE(blocks::visit_block_dot(type, [](auto, auto) {})) << dtype_name(type);
}

}  // namespace
}  // namespace tandem

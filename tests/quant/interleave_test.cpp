// tandem's 16-row interleaved formats: interleaving and taking apart are exact inverses, and an
// interleaved tensor dequantizes to its plain rows' values.
#include "quant/interleave.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "core/blocks.h"
#include "core/error.h"
#include "quant/quant.h"

namespace tandem {
namespace {

std::vector<uint8_t> quantized_rows(DType type, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(size_t(rows * cols));
  for (float& v : values) v = normal(rng);
  const size_t stride = row_bytes(type, uint64_t(cols));
  std::vector<uint8_t> bytes(size_t(rows) * stride);
  for (int64_t r = 0; r < rows; ++r)
    quantize_row(type, values.data() + r * cols, bytes.data() + size_t(r) * stride, cols);
  return bytes;
}

TEST(Interleave, TakingApartGivesBackTheSameBytesAndValues) {
  for (DType base : {DType::Q8_0, DType::Q5_0, DType::Q4_K}) {
    const DType type = interleaved_format(base);
    EXPECT_EQ(dtype_info(type).base, base);
    EXPECT_EQ(dtype_info(type).row_group, 16u);
    for (int64_t cols : {256, 512, 2048}) {
      const int64_t rows = 32;
      const std::vector<uint8_t> plain = quantized_rows(base, rows, cols, uint32_t(cols));
      const size_t plain_group = 16 * row_bytes(base, uint64_t(cols));
      const size_t group = 16 * row_bytes(type, uint64_t(cols));
      std::vector<uint8_t> mixed(2 * group), back(plain.size());
      for (int g = 0; g < 2; ++g) {
        interleave_rows(type, plain.data() + g * plain_group, cols, mixed.data() + g * group);
        take_apart_rows(type, mixed.data() + g * group, cols, back.data() + g * plain_group);
      }
      EXPECT_EQ(back, plain) << dtype_name(type) << " cols=" << cols;
      // The layout really moves bytes (a copy would pass the round trip too).
      EXPECT_NE(std::vector<uint8_t>(mixed.begin(), mixed.begin() + 64),
                std::vector<uint8_t>(plain.begin(), plain.begin() + 64));

      std::vector<float> from_plain(size_t(rows * cols)), from_mixed(size_t(rows * cols));
      dequantize_row(base, plain.data(), from_plain.data(), rows * cols);
      dequantize_interleaved(type, mixed.data(), rows, cols, from_mixed.data());
      EXPECT_EQ(from_mixed, from_plain) << dtype_name(type) << " cols=" << cols;
    }
  }
}

// Row 3, column 37 of a Q8_0 group lands where core/blocks.h says: column 37 is element 5 of
// block 1, so chunk 5 / 2 = 2, pair position 1: byte 32 * 2 + 2 * 3 + 1 of the group's block 1.
TEST(Interleave, Q8_0LayoutIsThePairLayoutOfBlocksH) {
  const int64_t cols = 64;
  std::vector<uint8_t> plain(16 * row_bytes(DType::Q8_0, cols), 0);
  auto* blocks = reinterpret_cast<BlockQ8_0*>(plain.data());
  blocks[3 * 2 + 1].qs[5] = 77;  // row 3, block 1, element 5
  std::vector<uint8_t> mixed(plain.size());
  interleave_rows(DType::Q8_0_R16, plain.data(), cols, mixed.data());
  const auto* group = reinterpret_cast<const BlockQ8_0_R16*>(mixed.data());
  EXPECT_EQ(group[1].qs[32 * 2 + 2 * 3 + 1], 77);
}

TEST(Interleave, RefusesFormatsWithoutALayoutAndRaggedRows) {
  EXPECT_FALSE(has_interleaved_format(DType::Q5_K));
  EXPECT_THROW(interleaved_format(DType::Q5_K), Error);
  std::vector<uint8_t> bytes(16 * 148 * 2);
  EXPECT_THROW(interleave_rows(DType::Q4_K, bytes.data(), 256, bytes.data()), Error);
  EXPECT_THROW(interleave_rows(DType::Q4_K_R16, bytes.data(), 100, bytes.data()), Error);
  std::vector<float> out(16 * 256);
  EXPECT_THROW(dequantize_interleaved(DType::Q4_K_R16, bytes.data(), 8, 256, out.data()), Error);
}

TEST(Interleave, FormatsAreKnownByNumberAndName) {
  ASSERT_TRUE(find_dtype(1012).has_value());
  EXPECT_EQ(find_dtype(1012)->name, "Q4_K_R16");
  EXPECT_EQ(dtype_from_name("Q8_0_R16"), DType::Q8_0_R16);
  EXPECT_EQ(row_bytes(DType::Q8_0_R16, 64), row_bytes(DType::Q8_0, 64));
  EXPECT_EQ(row_bytes(DType::Q4_K_R16, 256), 148u);
  EXPECT_FALSE(is_interleaved(DType::Q4_K));
}

}  // namespace
}  // namespace tandem

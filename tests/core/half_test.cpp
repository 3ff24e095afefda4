#include "core/half.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>

namespace tandem {
namespace {

TEST(Half, EveryF16ValueRoundTripsThroughF32) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(uint16_t(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f)))) << h;
      continue;
    }
    EXPECT_EQ(f32_to_f16(f), h) << "f16 bits " << h;
  }
}

TEST(Half, F16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3c00);           // halfway, even stays
  EXPECT_EQ(f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);       // halfway, odd rounds up
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);                  // largest finite
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);                  // rounds to infinity
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);                  // smallest subnormal
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);                  // half of it, ties to even
  EXPECT_EQ(f32_to_f16(-0x1.8p-25f), 0x8001);               // above half rounds up
  EXPECT_EQ(f16_to_f32(0x0001), 0x1p-24f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
}

TEST(Half, Bf16IsTheHighHalfRoundedToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie, even
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3f818000u)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3f808001u)), 0x3f81);
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = bf16_to_f32(uint16_t(h));
    if (!std::isnan(f)) {
      EXPECT_EQ(f32_to_bf16(f), h);
    }
  }
}

}  // namespace
}  // namespace tandem

#include "text/byte_unicode.h"

#include <gtest/gtest.h>

#include <set>

namespace tandem {
namespace {

TEST(ByteUnicode, EveryByteHasADistinctCodepointThatMapsBack) {
  std::set<char32_t> seen;
  for (int b = 0; b < 256; ++b) {
    const char32_t cp = byte_to_codepoint(uint8_t(b));
    EXPECT_TRUE(seen.insert(cp).second) << b;
    ASSERT_EQ(codepoint_to_byte(cp), uint8_t(b));
  }
  EXPECT_FALSE(codepoint_to_byte(U'A' + 1000).has_value());
  EXPECT_FALSE(codepoint_to_byte(32).has_value());  // space itself is not in the alphabet
}

TEST(ByteUnicode, SpaceAndNewlineUseTheGpt2Letters) {
  EXPECT_EQ(bytes_to_token_text(" the"), "Ġthe");
  EXPECT_EQ(bytes_to_token_text("\n"), "Ċ");
  EXPECT_EQ(bytes_to_token_text("a"), "a");
}

TEST(ByteUnicode, AlphabetOrderStartsWithPrintableBytes) {
  const auto& order = byte_alphabet_order();
  EXPECT_EQ(order[0], '!');
  EXPECT_EQ(order[1], '"');
  EXPECT_EQ(order[93], '~');
  EXPECT_EQ(order[188], 0);  // first remapped byte
  std::set<uint8_t> all(order.begin(), order.end());
  EXPECT_EQ(all.size(), 256u);
}

TEST(ByteUnicode, Utf8EncodingOfEachLength) {
  EXPECT_EQ(utf8_encode(U'A'), "A");
  EXPECT_EQ(utf8_encode(0x120), "\xc4\xa0");
  EXPECT_EQ(utf8_encode(U'中'), "\xe4\xb8\xad");
  EXPECT_EQ(utf8_encode(0x1f600), "\xf0\x9f\x98\x80");
}

}  // namespace
}  // namespace tandem

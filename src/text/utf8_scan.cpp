#include "text/utf8_scan.h"

#include "core/error.h"
#include "text/byte_unicode.h"

namespace tandem {

Utf8Char scan_utf8_char(std::string_view text) {
  TANDEM_CHECK(!text.empty());
  const auto byte = [&](size_t i) { return uint8_t(text[i]); };
  const uint8_t lead = byte(0);
  if (lead < 0x80) return {Utf8Char::Kind::Complete, 1, lead};

  // Length and the allowed range of the second byte (the first continuation byte is where
  // overlong forms, surrogates and values above U+10FFFF show), per Unicode table 3-7.
  size_t length = 0;
  uint8_t second_min = 0x80, second_max = 0xBF;
  char32_t codepoint = 0;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2, codepoint = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3, codepoint = lead & 0x0F;
    if (lead == 0xE0) second_min = 0xA0;
    if (lead == 0xED) second_max = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4, codepoint = lead & 0x07;
    if (lead == 0xF0) second_min = 0x90;
    if (lead == 0xF4) second_max = 0x8F;
  } else {
    return {Utf8Char::Kind::Invalid, 1, 0};  // a continuation byte, C0, C1 or F5..FF
  }
  for (size_t i = 1; i < length; ++i) {
    if (i == text.size()) return {Utf8Char::Kind::Incomplete, i, 0};
    const uint8_t min = i == 1 ? second_min : 0x80, max = i == 1 ? second_max : 0xBF;
    if (byte(i) < min || byte(i) > max) return {Utf8Char::Kind::Invalid, i, 0};
    codepoint = (codepoint << 6) | (byte(i) & 0x3F);
  }
  return {Utf8Char::Kind::Complete, length, codepoint};
}

bool is_valid_utf8(std::string_view text) {
  for (size_t pos = 0; pos < text.size();) {
    const Utf8Char c = scan_utf8_char(text.substr(pos));
    if (c.kind != Utf8Char::Kind::Complete) return false;
    pos += c.size;
  }
  return true;
}

std::string sanitize_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const Utf8Char c = scan_utf8_char(text.substr(pos));
    if (c.kind == Utf8Char::Kind::Complete)
      out.append(text.substr(pos, c.size));
    else
      out += utf8_encode(kReplacementCharacter);
    pos += c.size;
  }
  return out;
}

}  // namespace tandem

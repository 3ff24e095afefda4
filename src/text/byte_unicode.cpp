#include "text/byte_unicode.h"

namespace tandem {
namespace {

// Printable bytes map to themselves; the other 68 take code points 256, 257, ... in byte order.
bool is_printable_byte(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174; }

struct Tables {
  std::array<char32_t, 256> codepoint{};
  std::array<uint8_t, 256> order{};
  Tables() {
    int next_remapped = 256, slot = 0;
    for (int b = 0; b < 256; ++b)
      if (is_printable_byte(b)) order[size_t(slot++)] = uint8_t(b);
    for (int b = 0; b < 256; ++b) {
      if (is_printable_byte(b)) {
        codepoint[size_t(b)] = char32_t(b);
      } else {
        codepoint[size_t(b)] = char32_t(next_remapped++);
        order[size_t(slot++)] = uint8_t(b);
      }
    }
  }
};

const Tables& tables() {
  static const Tables instance;
  return instance;
}

}  // namespace

char32_t byte_to_codepoint(uint8_t byte) { return tables().codepoint[byte]; }

std::optional<uint8_t> codepoint_to_byte(char32_t codepoint) {
  if (codepoint < 256 && is_printable_byte(int(codepoint))) return uint8_t(codepoint);
  if (codepoint < 256 || codepoint >= 256 + 68) return std::nullopt;
  // Remapped bytes are numbered in byte order among the non-printable ones.
  int index = int(codepoint - 256);
  for (int b = 0; b < 256; ++b)
    if (!is_printable_byte(b) && index-- == 0) return uint8_t(b);
  return std::nullopt;
}

const std::array<uint8_t, 256>& byte_alphabet_order() { return tables().order; }

std::string utf8_encode(char32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xc0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += char(0xe0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3f));
    out += char(0x80 | (cp & 0x3f));
  } else {
    out += char(0xf0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3f));
    out += char(0x80 | ((cp >> 6) & 0x3f));
    out += char(0x80 | (cp & 0x3f));
  }
  return out;
}

std::string bytes_to_token_text(std::string_view bytes) {
  std::string out;
  for (char c : bytes) out += utf8_encode(byte_to_codepoint(uint8_t(c)));
  return out;
}

}  // namespace tandem

#pragma once
// Reading UTF-8 one character at a time, strictly (no overlong forms, no surrogates, nothing
// above U+10FFFF), as the decoders that turn token bytes into displayable text need it: a token
// may end in the middle of a character, and model output may contain bytes that are not UTF-8
// at all.
#include <cstddef>
#include <string>
#include <string_view>

namespace tandem {

inline constexpr char32_t kReplacementCharacter = 0xFFFD;

struct Utf8Char {
  enum class Kind {
    Complete,    // a well-formed character of `size` bytes
    Incomplete,  // the text ends after `size` bytes that could still begin a character
    Invalid,     // `size` bytes (at least 1) that can never be part of a character
  };
  Kind kind = Kind::Invalid;
  size_t size = 0;
  char32_t codepoint = 0;  // Complete only
};

// The character at the start of `text` (which must not be empty). An Invalid result covers the
// "maximal subpart" that Unicode says one U+FFFD should replace, so invalid input turns into
// the same replacement characters as in other conforming decoders.
Utf8Char scan_utf8_char(std::string_view text);

bool is_valid_utf8(std::string_view text);

// `text` with every invalid sequence (and a truncated one at the end) replaced by U+FFFD.
std::string sanitize_utf8(std::string_view text);

}  // namespace tandem

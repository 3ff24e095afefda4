#pragma once
// The byte-level BPE alphabet of GPT-2-style tokenizers (used by DeepSeek): each of the 256 bytes
// is written as one printable Unicode character in token strings, so that "Ġthe" means " the".
#include <array>
#include <cstdint>
#include <optional>
#include <string>

namespace tandem {

// Code point that stands for `byte` in token strings.
char32_t byte_to_codepoint(uint8_t byte);
// The byte a code point stands for, or nullopt if it is not part of the alphabet.
std::optional<uint8_t> codepoint_to_byte(char32_t codepoint);

// The 256 bytes in alphabet order (printable bytes first, then the remapped ones); vocabularies
// list their byte tokens in this order.
const std::array<uint8_t, 256>& byte_alphabet_order();

// UTF-8 encoding of one code point (no validation: callers pass valid scalar values).
std::string utf8_encode(char32_t codepoint);

// A byte string written in the alphabet, e.g. " the" -> "Ġthe".
std::string bytes_to_token_text(std::string_view bytes);

}  // namespace tandem

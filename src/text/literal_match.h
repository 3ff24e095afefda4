#pragma once
// Small pieces the grammars share (JSON keys and enums, tool names and markers): a set of texts as
// bits, narrowed byte by byte, and taking a known prefix off a string.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::literal {

// The first `n` bits set (all 64 from 64 on).
inline uint64_t all_of(size_t n) {
  return n >= 64 ? ~uint64_t(0) : (uint64_t(1) << n) - 1;
}

// Of the `alive` texts (a bit each), those whose byte at `pos` is `c`.
inline uint64_t continuing(const std::vector<std::string>& texts, uint64_t alive, int32_t pos,
                           char c) {
  uint64_t next = 0;
  for (size_t i = 0; i < texts.size(); ++i)
    if ((alive >> i & 1) && pos < int32_t(texts[i].size()) && texts[i][size_t(pos)] == c)
      next |= uint64_t(1) << i;
  return next;
}

// The index of the `alive` text that is `pos` bytes long, or -1 (for sets where none is a prefix
// of another).
inline int32_t finished(const std::vector<std::string>& texts, uint64_t alive, int32_t pos) {
  for (size_t i = 0; i < texts.size(); ++i)
    if ((alive >> i & 1) && int32_t(texts[i].size()) == pos) return int32_t(i);
  return -1;
}

// Removes `prefix` from the front of `s`; false (and `s` unchanged) if `s` does not start with it.
inline bool consume(std::string_view& s, std::string_view prefix) {
  if (!s.starts_with(prefix)) return false;
  s.remove_prefix(prefix.size());
  return true;
}

}  // namespace tandem::literal

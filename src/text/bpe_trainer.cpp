#include "text/bpe_trainer.h"

#include <cctype>
#include <map>
#include <utility>

#include "text/byte_unicode.h"

namespace tandem {
namespace {

enum class CharClass { Letter, Digit, Space, Other };

CharClass classify(unsigned char c) {
  if (std::isalpha(c) || c >= 0x80) return CharClass::Letter;  // UTF-8 bytes stay inside words
  if (std::isdigit(c)) return CharClass::Digit;
  if (c == ' ') return CharClass::Space;
  return CharClass::Other;
}

// Words: an optional leading space followed by a run of one class.
std::map<std::string, int> count_words(std::string_view corpus) {
  std::map<std::string, int> counts;
  size_t i = 0;
  while (i < corpus.size()) {
    size_t start = i;
    if (corpus[i] == ' ' && i + 1 < corpus.size() && corpus[i + 1] != ' ') ++i;
    const CharClass cls = classify(uint8_t(corpus[i]));
    ++i;
    while (i < corpus.size() && classify(uint8_t(corpus[i])) == cls && cls != CharClass::Other) ++i;
    ++counts[std::string(corpus.substr(start, i - start))];
  }
  return counts;
}

}  // namespace

BpeVocabulary train_byte_level_bpe(std::string_view corpus, size_t max_merges) {
  // Each distinct word as a sequence of token texts, with its frequency.
  std::vector<std::pair<std::vector<std::string>, int>> words;
  for (const auto& [word, count] : count_words(corpus)) {
    std::vector<std::string> pieces;
    for (char c : word) pieces.push_back(utf8_encode(byte_to_codepoint(uint8_t(c))));
    words.emplace_back(std::move(pieces), count);
  }

  BpeVocabulary vocab;
  while (vocab.merges.size() < max_merges) {
    std::map<std::pair<std::string, std::string>, int> pair_counts;
    for (const auto& [pieces, count] : words)
      for (size_t j = 0; j + 1 < pieces.size(); ++j) pair_counts[{pieces[j], pieces[j + 1]}] += count;
    const std::pair<std::string, std::string>* best = nullptr;
    int best_count = 1;  // a pair seen once teaches nothing
    for (const auto& [pair, count] : pair_counts)
      if (count > best_count) {
        best = &pair;
        best_count = count;
      }
    if (!best) break;
    const auto [left, right] = *best;
    const std::string merged = left + right;
    vocab.merges.push_back(left + " " + right);
    vocab.merged_tokens.push_back(merged);
    for (auto& [pieces, count] : words) {
      std::vector<std::string> out;
      for (size_t j = 0; j < pieces.size(); ++j) {
        if (j + 1 < pieces.size() && pieces[j] == left && pieces[j + 1] == right) {
          out.push_back(merged);
          ++j;
        } else {
          out.push_back(pieces[j]);
        }
      }
      pieces = std::move(out);
    }
  }
  return vocab;
}

}  // namespace tandem

#include "runtime/output_text.h"

#include <algorithm>

namespace tandem {
namespace {

// Length of the longest suffix of `text` that is a prefix of some stop string: text that may
// still turn into a stop sequence is held back instead of handed out.
size_t partial_stop_length(std::string_view text, const std::vector<std::string>& stops) {
  size_t longest = 0;
  for (const std::string& stop : stops)
    for (size_t n = std::min(stop.size() - 1, text.size()); n > longest; --n)
      if (text.substr(text.size() - n) == std::string_view(stop).substr(0, n)) {
        longest = n;
        break;
      }
  return longest;
}

}  // namespace

OutputText::OutputText(const Tokenizer& tokenizer, std::vector<std::string> stop,
                       bool render_special)
    : tokenizer_(tokenizer), stop_(std::move(stop)), decoder_(tokenizer, render_special) {}

std::string OutputText::push(int32_t token) {
  if (finished_) return {};
  if (tokenizer_.is_end_of_generation(token)) {
    finished_ = true;
    return finish();
  }
  tokens_.push_back(token);
  held_ += decoder_.push(token);
  // The earliest stop string wins; the text before it is the output's end.
  size_t cut = std::string::npos;
  for (const std::string& stop : stop_) cut = std::min(cut, held_.find(stop));
  if (cut != std::string::npos) {
    finished_ = true;
    std::string out = held_.substr(0, cut);
    held_.clear();
    return out;
  }
  const size_t keep = partial_stop_length(held_, stop_);
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string OutputText::finish() {
  std::string out = std::move(held_) + decoder_.finish();
  held_.clear();
  return out;
}

}  // namespace tandem

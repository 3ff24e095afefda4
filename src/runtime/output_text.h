#pragma once
// What one sequence does with each sampled token: end of generation, stop strings, and the text
// that can be handed out now (complete UTF-8 characters that cannot be the start of a stop
// string). Shared by Session (one sequence, its own loop) and BatchScheduler (many sequences,
// one forward pass per step), so both stop and stream text the same way.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "text/tokenizer.h"

namespace tandem {

class OutputText {
 public:
  // `render_special`: control tokens other than end of generation give their text.
  OutputText(const Tokenizer& tokenizer, std::vector<std::string> stop,
             bool render_special = false);

  // Takes the next sampled token; returns the text it releases (possibly empty). After a token
  // that ends the output (end of generation, or a stop string completed) finished() is true and
  // the returned text is everything up to the stop string.
  std::string push(int32_t token);
  // The text still held back (an unfinished character, or the start of a stop string that
  // never completed): call once when generation ends for another reason (length, cancel).
  std::string finish();

  bool finished() const { return finished_; }
  // Tokens of the output, without an end-of-generation token.
  const std::vector<int32_t>& tokens() const { return tokens_; }

 private:
  const Tokenizer& tokenizer_;
  std::vector<std::string> stop_;
  StreamingDecoder decoder_;
  std::string held_;  // decoded text not yet handed out (may be the start of a stop string)
  std::vector<int32_t> tokens_;
  bool finished_ = false;
};

}  // namespace tandem

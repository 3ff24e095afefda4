#pragma once
// The pre-tokenizer of byte-level BPE vocabularies: it cuts text into pieces that BPE then
// merges separately, so no token ever spans two pieces (a number never merges with the word
// before it, a CJK run never with Latin letters).
//
// A vocabulary defines it as a list of regexes applied in sequence (one for most families,
// several for DeepSeek's): each regex splits every piece produced so far into the parts it
// matches and the gaps between matches, and both kinds of part are kept. A later regex therefore sees each piece on its own (a lookahead stops
// at the end of the piece). The regexes are compiled once with PCRE2 in UTF + UCP mode (\p{L},
// \s ... follow Unicode) and are shared read-only, so one PreTokenizer serves many threads.
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

// One piece of the input: bytes [offset, offset + size) of the text given to split().
struct TextSpan {
  size_t offset = 0;
  size_t size = 0;
};

class PreTokenizer {
 public:
  // `name` is the GGUF `tokenizer.ggml.pre` value: "deepseek-v3", "deepseek-llm" (DeepSeek V2
  // and V2-Lite), "deepseek-coder", "qwen2" (Qwen2/3), "gpt-4o" (o200k: gpt-oss), "glm4"
  // (GLM-4.5) or "kimi-k2". Anything else throws an Error listing these.
  static PreTokenizer for_name(std::string_view name);
  static const std::vector<std::string>& supported_names();

  const std::string& name() const { return name_; }

  // Cuts `text` into consecutive pieces that cover it exactly (concatenated, they give the
  // text back). Bytes that are not valid UTF-8 never match a regex, so they stay in the gaps and
  // still reach BPE, which handles any byte.
  std::vector<TextSpan> split(std::string_view text) const;
  // The same, writing into `out` (cleared first) so a caller can reuse its buffers.
  void split(std::string_view text, std::vector<TextSpan>& out) const;

 private:
  struct Regex;
  PreTokenizer() = default;
  static std::shared_ptr<const Regex> compile(std::string_view pattern);

  std::string name_;
  // Applied in order. Compiled patterns are immutable, so copies of a PreTokenizer share them.
  std::vector<std::shared_ptr<const Regex>> regexes_;
};

}  // namespace tandem

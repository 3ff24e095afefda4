#pragma once
// One conversation on one sequence slot of an Engine: evaluates a prompt (reusing the cached
// prefix it shares with the previous one, so a multi-turn chat only evaluates the new turn),
// then samples tokens and hands out text as it is generated.
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "text/sampler.h"

namespace tandem {

class Engine;

struct GenerateOptions {
  int32_t max_tokens = 256;              // new tokens at most; generation also stops at EOS/EOT
  SamplerParams sampling;
  std::vector<std::string> stop;         // stop when the output ends with one of these
};

struct GenerateResult {
  std::vector<int32_t> tokens;           // generated ids (without the stop sequence's text cut)
  std::string text;                      // generated text, stop sequence removed
  std::string finish_reason;             // "stop" (EOS or stop string), "length", "cancelled"
  int32_t prompt_tokens = 0;             // tokens of the prompt
  int32_t prompt_tokens_evaluated = 0;   // of them, not found in the cache
  double prompt_seconds = 0, decode_seconds = 0;
  double first_token_seconds = 0;        // from the call to the first generated token
};

// Called with each piece of complete UTF-8 text; return false to stop generating.
using TextCallback = std::function<bool(std::string_view)>;

class Session {
 public:
  explicit Session(Engine& engine, int32_t seq = 0) : engine_(engine), seq_(seq) {}

  GenerateResult generate(std::span<const int32_t> prompt, const GenerateOptions& options,
                          const TextCallback& on_text);
  // Tokens whose latents are in the cache (prompt and generated so far).
  const std::vector<int32_t>& cached_tokens() const { return cached_; }
  void reset() { cached_.clear(); }

 private:
  Engine& engine_;
  int32_t seq_;
  std::vector<int32_t> cached_;
  std::vector<float> logits_;
};

}  // namespace tandem

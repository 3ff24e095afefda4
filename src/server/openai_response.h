#pragma once
// OpenAI response bodies: whole responses, streamed chunks (the JSON after "data: "), and the
// usage object, for chat completions and legacy completions.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/batch_scheduler.h"
#include "text/chat_template.h"

namespace tandem {
class Tokenizer;
}

namespace tandem::server {

struct ResponseMeta {
  std::string id;       // "chatcmpl-…" or "cmpl-…"
  int64_t created = 0;  // Unix seconds
  std::string model;
  bool chat = true;
};

struct Usage {
  int32_t prompt_tokens = 0, completion_tokens = 0;
  int32_t cached_tokens = 0;  // of the prompt, taken from the prefix cache
};

// One choice of a whole response. `logprobs` null when the request did not ask for them. Chat: a
// non-empty `reasoning` goes in message.reasoning_content.
struct ChoiceOutput {
  std::string text, reasoning, finish_reason;
  const std::vector<TokenLogprob>* logprobs = nullptr;
  std::vector<ChatToolCall> tool_calls;  // chat: message.tool_calls (content null when empty)
};

// A non-streamed response with its choices, indexed in order.
std::string full_response(const ResponseMeta& meta, const std::vector<ChoiceOutput>& choices,
                          const Tokenizer& tokenizer, Usage usage);

// One streamed chunk of choice `index`: `text` as the delta (chat: the first chunk also carries
// the role; a non-empty `reasoning` goes in delta.reasoning_content), `finish_reason` on the last.
std::string stream_chunk(const ResponseMeta& meta, int32_t index, const std::string& text,
                         bool first, const std::vector<TokenLogprob>* logprobs,
                         const Tokenizer& tokenizer,
                         const std::optional<std::string>& finish_reason,
                         const std::string& reasoning = {});

// A streamed chunk of choice `index` carrying its tool calls whole (delta.tool_calls).
std::string tool_calls_chunk(const ResponseMeta& meta, int32_t index,
                             const std::vector<ChatToolCall>& calls);

// The extra last chunk of stream_options.include_usage: no choices, the usage.
std::string usage_chunk(const ResponseMeta& meta, Usage usage);

}  // namespace tandem::server

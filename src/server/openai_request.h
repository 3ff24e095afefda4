#pragma once
// The bodies of POST /v1/chat/completions and /v1/completions, read and checked as OpenAI does:
// unknown fields are ignored, known fields with a wrong type or value are rejected with a 400
// that names them. Context-dependent limits (prompt longer than the context) are checked here
// too, so a request that cannot run never reaches the scheduler.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/batch_scheduler.h"
#include "text/chat_template.h"
#include "text/tool_calls.h"

namespace tandem {
class Tokenizer;
}

namespace tandem::server {

struct ParsedRequest {
  CompletionRequest completion;  // prompt tokens, max_tokens, sampling, stop, logprobs
  bool stream = false;
  bool include_usage = false;    // stream_options.include_usage
  bool logprobs = false;         // chat: logprobs; completions: logprobs >= 0
  std::string model;             // as the client named it (echoed back)
  // Chat: the template's switches as the request set them (chat_template_kwargs.enable_thinking,
  // reasoning_effort), and whether the reply starts inside a reasoning block.
  ChatOptions chat_options;
  bool starts_in_reasoning = false;
  // The tools offered (null with none or tool_choice "none"): the reply's calls are parsed out
  // of it.
  std::shared_ptr<const std::vector<ToolSpec>> tools;
};

struct PromptContext {
  const Tokenizer& tokenizer;
  ChatTemplateKind chat_template;
  int64_t n_ctx;                  // tokens one sequence holds
  int32_t default_max_tokens;     // when the request names none
};

// Throw ApiError (400) naming the field at fault. `body` is the raw request body. Chat requests
// take, beside OpenAI's fields, `reasoning_effort` (low, medium, high: gpt-oss) and
// `chat_template_kwargs: {"enable_thinking": bool}` (Qwen3, GLM-4.5, DeepSeek-V3.1), as vLLM and
// llama.cpp do.
ParsedRequest parse_chat_request(std::string_view body, const PromptContext& context);
ParsedRequest parse_completion_request(std::string_view body, const PromptContext& context);
// POST /apply-template (llama.cpp's): a chat request's messages and switches as the prompt text
// the model would get, {"prompt": "..."}. Same checks as a chat request.
std::string apply_template_response(std::string_view body, const PromptContext& context);

}  // namespace tandem::server

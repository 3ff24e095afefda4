#include "server/openai_response.h"

#include <nlohmann/json.hpp>

#include "text/tokenizer.h"

namespace tandem::server {
namespace {

using nlohmann::json;

// Token texts can be part of a UTF-8 character: invalid sequences become U+FFFD in the JSON,
// and the exact bytes go in "bytes" as OpenAI does.
std::string dump(const json& value) { return value.dump(-1, ' ', false, json::error_handler_t::replace); }

json usage_json(Usage usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", usage.cached_tokens}}}};
}

json token_entry(const Tokenizer& tokenizer, int32_t id, float logprob) {
  const std::string text = tokenizer.decode(std::span<const int32_t>(&id, 1));
  return {{"token", text}, {"logprob", logprob}, {"bytes", std::vector<uint8_t>(text.begin(), text.end())}};
}

// Chat: {"content": [{token, logprob, bytes, top_logprobs: [...]}]}. Completions: the legacy
// {"tokens", "token_logprobs", "top_logprobs": [{text: logprob}], "text_offset"}.
json logprobs_json(bool chat, const std::vector<TokenLogprob>& logprobs, const Tokenizer& tokenizer,
                   size_t text_offset) {
  if (chat) {
    json content = json::array();
    for (const TokenLogprob& t : logprobs) {
      json entry = token_entry(tokenizer, t.token, t.logprob);
      entry["top_logprobs"] = json::array();
      for (const auto& [id, lp] : t.top) entry["top_logprobs"].push_back(token_entry(tokenizer, id, lp));
      content.push_back(std::move(entry));
    }
    return {{"content", content}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
  for (const TokenLogprob& t : logprobs) {
    const std::string text = tokenizer.decode(std::span<const int32_t>(&t.token, 1));
    tokens.push_back(text);
    token_logprobs.push_back(t.logprob);
    json alternatives = json::object();
    for (const auto& [id, lp] : t.top) alternatives[tokenizer.decode(std::span<const int32_t>(&id, 1))] = lp;
    top.push_back(alternatives);
    offsets.push_back(text_offset);
    text_offset += text.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}, {"text_offset", offsets}};
}

// OpenAI's tool_calls list; streamed deltas also carry each call's index.
json tool_calls_json(const std::vector<ChatToolCall>& calls, bool indexed) {
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json call = {{"id", calls[i].id},
                 {"type", "function"},
                 {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (indexed) call["index"] = i;
    out.push_back(std::move(call));
  }
  return out;
}

json envelope(const ResponseMeta& meta, const char* object) {
  return {{"id", meta.id}, {"object", object}, {"created", meta.created}, {"model", meta.model},
          {"system_fingerprint", "tandem"}};
}

}  // namespace

std::string full_response(const ResponseMeta& meta, const std::vector<ChoiceOutput>& choices,
                          const Tokenizer& tokenizer, Usage usage) {
  json out = envelope(meta, meta.chat ? "chat.completion" : "text_completion");
  out["choices"] = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceOutput& c = choices[i];
    json choice = {{"index", i},
                   {"finish_reason", c.finish_reason},
                   {"logprobs", c.logprobs ? logprobs_json(meta.chat, *c.logprobs, tokenizer, 0)
                                           : json(nullptr)}};
    if (meta.chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
      if (!c.reasoning.empty()) choice["message"]["reasoning_content"] = c.reasoning;
      if (!c.tool_calls.empty()) {
        if (c.text.empty()) choice["message"]["content"] = nullptr;
        choice["message"]["tool_calls"] = tool_calls_json(c.tool_calls, false);
      }
    } else {
      choice["text"] = c.text;
    }
    out["choices"].push_back(std::move(choice));
  }
  out["usage"] = usage_json(usage);
  return dump(out);
}

std::string stream_chunk(const ResponseMeta& meta, int32_t index, const std::string& text,
                         bool first, const std::vector<TokenLogprob>* logprobs,
                         const Tokenizer& tokenizer,
                         const std::optional<std::string>& finish_reason,
                         const std::string& reasoning) {
  json out = envelope(meta, meta.chat ? "chat.completion.chunk" : "text_completion");
  json choice = {{"index", index},
                 {"finish_reason", finish_reason ? json(*finish_reason) : json(nullptr)},
                 {"logprobs", logprobs && !logprobs->empty()
                                  ? logprobs_json(meta.chat, *logprobs, tokenizer, 0)
                                  : json(nullptr)}};
  if (meta.chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!reasoning.empty()) delta["reasoning_content"] = reasoning;
    if (!text.empty() || (first && !finish_reason)) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  out["choices"] = json::array({choice});
  return dump(out);
}

std::string tool_calls_chunk(const ResponseMeta& meta, int32_t index,
                             const std::vector<ChatToolCall>& calls) {
  json out = envelope(meta, "chat.completion.chunk");
  out["choices"] = json::array({{{"index", index},
                                 {"delta", {{"tool_calls", tool_calls_json(calls, true)}}},
                                 {"logprobs", nullptr},
                                 {"finish_reason", nullptr}}});
  return dump(out);
}

std::string usage_chunk(const ResponseMeta& meta, Usage usage) {
  json out = envelope(meta, meta.chat ? "chat.completion.chunk" : "text_completion");
  out["choices"] = json::array();
  out["usage"] = usage_json(usage);
  return dump(out);
}

}  // namespace tandem::server

#include "server/openai_request.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "server/api_error.h"
#include "server/response_format.h"
#include "text/tokenizer.h"
#include "text/tool_calls.h"

namespace tandem::server {
namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiError(400, message, param);
}

json parse_body(std::string_view body) {
  // nlohmann checks UTF-8 in strings, so invalid UTF-8 is a parse error here too.
  json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded())
    throw ApiError(400, "the request body is not valid JSON (UTF-8); send a JSON object");
  if (!parsed.is_object()) throw ApiError(400, "the request body must be a JSON object");
  return parsed;
}

// A present, non-null field.
const json* field(const json& body, const char* name) {
  const auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

double number(const json& body, const char* name, double fallback, double min, double max,
              bool min_open = false) {
  const json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_number()) bad(name, fmt::format("'{}' must be a number", name));
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < min || x > max || (min_open && x == min))
    bad(name, fmt::format("'{}' must be in {}{}, {}] (got {})", name, min_open ? "(" : "[", min, max,
                          v->dump()));
  return x;
}

// An integer field; values past int64 or with a fraction are rejected, values past `max` too.
int64_t integer(const json& body, const char* name, int64_t fallback, int64_t min, int64_t max) {
  const json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_number_integer()) bad(name, fmt::format("'{}' must be an integer (got {})", name, v->dump()));
  if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    bad(name, fmt::format("'{}' is too large (got {})", name, v->dump()));
  const int64_t x = v->get<int64_t>();
  if (x < min || x > max) bad(name, fmt::format("'{}' must be in [{}, {}] (got {})", name, min, max, x));
  return x;
}

bool boolean(const json& body, const char* name, bool fallback) {
  const json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_boolean()) bad(name, fmt::format("'{}' must be true or false", name));
  return v->get<bool>();
}

// The fields both endpoints share: sampling, stop, n, stream, max_tokens (clamped to the
// context that is left after the prompt), model.
void parse_common(const json& body, const PromptContext& context, const char* prompt_param,
                  ParsedRequest& out) {
  if (const json* v = field(body, "model")) {
    if (!v->is_string()) bad("model", "'model' must be a string");
    out.model = v->get<std::string>();
  }
  // n choices: choice i samples with seed + i (see CompletionRequest); at most the server's slots.
  out.completion.n = int32_t(integer(body, "n", 1, 1, 256));
  if (std::shared_ptr<const JsonSchema> schema = parse_response_format(body)) {
    if (out.completion.constraint)
      bad("response_format", "'response_format' cannot be combined with a required tool call");
    out.completion.constraint = [schema] { return std::make_unique<JsonRecognizer>(*schema); };
  }
  out.stream = boolean(body, "stream", false);
  out.completion.ignore_eos = boolean(body, "ignore_eos", false);  // llama.cpp's extension
  if (const json* v = field(body, "stream_options")) {
    if (!v->is_object()) bad("stream_options", "'stream_options' must be an object");
    out.include_usage = boolean(*v, "include_usage", false);
  }

  SamplerParams& s = out.completion.options.sampling;
  s.temperature = float(number(body, "temperature", 1.0, 0.0, 2.0));
  s.top_p = float(number(body, "top_p", 1.0, 0.0, 1.0, /*min_open=*/true));
  s.top_k = int32_t(integer(body, "top_k", 0, 0, 1 << 30));
  s.min_p = float(number(body, "min_p", 0.0, 0.0, 1.0));
  s.presence_penalty = float(number(body, "presence_penalty", 0.0, -2.0, 2.0));
  s.frequency_penalty = float(number(body, "frequency_penalty", 0.0, -2.0, 2.0));
  s.repeat_penalty = float(number(body, "repeat_penalty", 1.0, 0.0, 10.0, /*min_open=*/true));
  // Any 64-bit seed; without one each request draws its own.
  if (const json* v = field(body, "seed")) {
    if (!v->is_number_integer()) bad("seed", "'seed' must be an integer");
    s.seed = v->is_number_unsigned() ? v->get<uint64_t>() : uint64_t(v->get<int64_t>());
  } else {
    s.seed = std::random_device{}() | (uint64_t(std::random_device{}()) << 32);
  }

  if (const json* v = field(body, "stop")) {
    std::vector<std::string>& stop = out.completion.options.stop;
    if (v->is_string()) {
      stop.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      if (v->size() > 4) bad("stop", "'stop' holds at most 4 strings");
      for (const json& item : *v) {
        if (!item.is_string()) bad("stop", "'stop' must be a string or a list of strings");
        stop.push_back(item.get<std::string>());
      }
    } else {
      bad("stop", "'stop' must be a string or a list of strings");
    }
    for (const std::string& text : stop)
      if (text.empty()) bad("stop", "stop strings must not be empty");
  }

  const int64_t prompt = int64_t(out.completion.prompt.size());
  if (prompt == 0) bad(prompt_param, "the prompt is empty");
  if (prompt >= context.n_ctx)
    bad(prompt_param,
        fmt::format("the prompt has {} tokens but the context holds {} (room for at least one generated "
                    "token is needed); shorten the prompt or start the server with a larger --ctx",
                    prompt, context.n_ctx));
  // max_completion_tokens is the newer name; max_tokens the older. Values past the context are
  // clamped to it: generation then ends with finish_reason "length" when the context is full.
  const int64_t room = context.n_ctx - prompt;
  const int64_t fallback = context.default_max_tokens > 0 ? std::min<int64_t>(context.default_max_tokens, room) : room;
  int64_t max_tokens = integer(body, "max_tokens", fallback, 0, std::numeric_limits<int64_t>::max());
  max_tokens = integer(body, "max_completion_tokens", max_tokens, 0, std::numeric_limits<int64_t>::max());
  out.completion.options.max_tokens = int32_t(std::min(max_tokens, room));
}

std::string text_of_content(const json& content, size_t index) {
  const std::string param = fmt::format("messages[{}].content", index);
  if (content.is_string()) return content.get<std::string>();
  if (content.is_null()) return {};
  if (!content.is_array()) bad(param, "a message's content must be a string or a list of text parts");
  std::string text;
  for (const json& part : content) {
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      bad(param, "each content part must be an object with a 'type'");
    if (part["type"] != "text")
      bad(param, fmt::format("content parts of type '{}' are not supported; only 'text'",
                             part["type"].get<std::string>()));
    if (!part.contains("text") || !part["text"].is_string()) bad(param, "a text part needs a string 'text'");
    text += part["text"].get<std::string>();
  }
  return text;
}

}  // namespace

std::string error_body(int status, const std::string& message, const std::string& param,
                       const std::string& type) {
  json error = {{"message", message}, {"type", type}, {"param", param.empty() ? json(nullptr) : json(param)},
                {"code", status}};
  return json{{"error", error}}.dump();
}

namespace {

// A chat request's conversation and the template's switches, rendered into the prompt text.
struct ChatPrompt {
  std::string text;
  ChatOptions options;
};

// An assistant message's tool_calls: [{id, type: "function", function: {name, arguments}}].
std::vector<ChatToolCall> tool_calls_of(const json& calls, const std::string& param) {
  if (!calls.is_array()) bad(param, "'tool_calls' must be a list");
  std::vector<ChatToolCall> out;
  for (size_t j = 0; j < calls.size(); ++j) {
    const json& c = calls[j];
    const std::string at = fmt::format("{}[{}]", param, j);
    if (!c.is_object() || !c.contains("function") || !c["function"].is_object())
      bad(at, "a tool call must be an object with a 'function'");
    const json& f = c["function"];
    if (!f.contains("name") || !f["name"].is_string())
      bad(at + ".function.name", "a tool call needs a string 'name'");
    if (!f.contains("arguments") || !f["arguments"].is_string())
      bad(at + ".function.arguments", "a tool call's 'arguments' must be a string of JSON");
    out.push_back(
        {.id = c.contains("id") && c["id"].is_string() ? c["id"].get<std::string>() : std::string(),
         .name = f["name"].get<std::string>(),
         .arguments = f["arguments"].get<std::string>()});
  }
  return out;
}

// How the tools offered reach the prompt: a system message of tandem's (DeepSeek's templates do not
// render tools themselves), or the list the template renders (Qwen3's, GLM's).
struct ToolPrompt {
  std::string system;
  std::vector<std::string> listed;  // each tool as the template's `tojson` writes it
};

// The prompt of a chat request, with the tools offered (if any).
ChatPrompt render_chat(const json& body, const PromptContext& context,
                       const ToolPrompt& tools = {}) {
  const std::string& tools_prompt = tools.system;
  const json* messages = field(body, "messages");
  if (!messages) bad("messages", "'messages' is required");
  if (!messages->is_array() || messages->empty()) bad("messages", "'messages' must be a non-empty list");
  std::vector<ChatMessage> chat;
  const bool tools_supported = supports_tool_calls(context.chat_template);
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    const std::string param = fmt::format("messages[{}]", i);
    if (!m.is_object()) bad(param, "each message must be an object with 'role' and 'content'");
    if (!m.contains("role") || !m["role"].is_string()) bad(param + ".role", "a message needs a string 'role'");
    std::string role = m["role"].get<std::string>();
    if (role == "developer") role = "system";  // OpenAI's newer name for system prompts
    if (role != "system" && role != "user" && role != "assistant" && role != "tool")
      bad(param + ".role",
          fmt::format("role '{}' is not supported; use system, user, assistant or tool", role));
    if (role == "tool" && !tools_supported)
      bad(param + ".role",
          fmt::format("tool results need tool calls, which the {} chat template does not "
                      "have in tandem yet",
                      chat_template_name(context.chat_template)));
    const json& content = m.contains("content") ? m["content"] : json(nullptr);
    chat.push_back({role, text_of_content(content, i)});
    if (role == "assistant" && field(m, "tool_calls")) {
      if (!tools_supported)
        bad(param + ".tool_calls",
            fmt::format("the {} chat template does not have tool calls in tandem yet",
                        chat_template_name(context.chat_template)));
      chat.back().tool_calls = tool_calls_of(m["tool_calls"], param + ".tool_calls");
      chat.back().content_is_null = content.is_null();
    }
    // A reply's reasoning sent back apart from its content (DeepSeek's API shape).
    if (role == "assistant" && m.contains("reasoning_content") &&
        m["reasoning_content"].is_string())
      chat.back().reasoning_content = m["reasoning_content"].get<std::string>();
  }
  // The tools' description follows the system prompt (DeepSeek-V3.1's model card puts it there;
  // R1's template keeps only the last system message).
  if (!tools_prompt.empty()) {
    auto last_system = std::find_if(chat.rbegin(), chat.rend(),
                                    [](const ChatMessage& m) { return m.role == "system"; });
    if (last_system != chat.rend())
      last_system->content += "\n\n" + tools_prompt;
    else
      chat.insert(chat.begin(), {"system", tools_prompt});
  }
  ChatPrompt out;
  out.options.tools = tools.listed;
  if (const json* effort = field(body, "reasoning_effort")) {
    if (!effort->is_string() || (*effort != "low" && *effort != "medium" && *effort != "high"))
      bad("reasoning_effort", "'reasoning_effort' must be \"low\", \"medium\" or \"high\"");
    out.options.reasoning_effort = effort->get<std::string>();
  }
  if (const json* kwargs = field(body, "chat_template_kwargs")) {
    if (!kwargs->is_object())
      bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    if (kwargs->contains("enable_thinking")) {
      if (!(*kwargs)["enable_thinking"].is_boolean())
        bad("chat_template_kwargs.enable_thinking", "'enable_thinking' must be true or false");
      out.options.enable_thinking = (*kwargs)["enable_thinking"].get<bool>();
    }
  }
  const Tokenizer& tokenizer = context.tokenizer;
  const std::string bos = tokenizer.bos_id() ? std::string(tokenizer.token_text(*tokenizer.bos_id())) : std::string();
  out.text = apply_chat_template(context.chat_template, chat, out.options, bos);
  return out;
}

}  // namespace

namespace {

// `tools` and `tool_choice`: the tools the model may call and whether it must. Sets the request's
// constraint for a required call; returns how the tools reach the prompt (nothing when no tools
// are offered or tool_choice is "none"). `body_text` gives the tools' keys in the client's order,
// which templates that list tools keep.
ToolPrompt parse_tools(const json& body, std::string_view body_text, const PromptContext& context,
                       ParsedRequest& out) {
  const json* tools = field(body, "tools");
  const json* choice = field(body, "tool_choice");
  if (!tools || (tools->is_array() && tools->empty())) {
    if (choice && *choice != "none" && *choice != "auto")
      bad("tool_choice", "'tool_choice' needs 'tools'");
    return {};
  }
  if (!tools->is_array() || tools->size() > 64)
    bad("tools", "'tools' must be a list of at most 64 tools");
  std::string mode = "auto", named;
  if (choice) {
    if (choice->is_string()) {
      mode = choice->get<std::string>();
      if (mode != "none" && mode != "auto" && mode != "required")
        bad("tool_choice",
            "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
            "\"function\": {\"name\": ...}}");
    } else if (choice->is_object() && choice->contains("function") &&
               (*choice)["function"].is_object() && (*choice)["function"].contains("name") &&
               (*choice)["function"]["name"].is_string()) {
      mode = "named";
      named = (*choice)["function"]["name"].get<std::string>();
    } else {
      bad("tool_choice",
          "'tool_choice' must be a string or {\"type\": \"function\", \"function\": {\"name\": "
          "...}}");
    }
  }
  if (mode == "none") return {};
  if (!supports_tool_calls(context.chat_template))
    bad("tools",
        fmt::format(
            "the {} chat template does not have tool calls in tandem yet (DeepSeek V3's, R1's "
            "and V3.1's, Qwen3's and GLM-4.5's do); "
            "send the request without 'tools', or with 'tool_choice': 'none'",
            chat_template_name(context.chat_template)));
  for (std::string_view marker : single_token_markers(context.chat_template))
    if (context.tokenizer.encode(std::string(marker), {.add_bos = false, .parse_special = true})
            .size() != 1)
      bad("tools", fmt::format("the model's vocabulary has no token {}, which tool calls in the {} "
                               "chat template are written with; use the model's own template",
                               marker, chat_template_name(context.chat_template)));
  // The tools again with their keys in the client's order, which tool lists in prompts keep.
  const auto ordered_tools = nlohmann::ordered_json::parse(body_text)["tools"];
  auto specs = std::make_shared<std::vector<ToolSpec>>();
  for (size_t i = 0; i < tools->size(); ++i) {
    const json& t = (*tools)[i];
    const std::string param = fmt::format("tools[{}]", i);
    if (!t.is_object() || !t.contains("type") || t["type"] != "function" ||
        !t.contains("function") || !t["function"].is_object())
      bad(param,
          "a tool must be {\"type\": \"function\", \"function\": {\"name\", \"description\", "
          "\"parameters\"}}");
    const json& f = t["function"];
    if (!f.contains("name") || !f["name"].is_string())
      bad(param + ".function.name", "a tool needs a string 'name'");
    ToolSpec spec{.name = f["name"].get<std::string>()};
    if (spec.name.empty() || spec.name.size() > 64 ||
        !std::all_of(spec.name.begin(), spec.name.end(),
                     [](char c) { return std::isalnum(uint8_t(c)) || c == '_' || c == '-'; }))
      bad(param + ".function.name", "a tool's name must be 1 to 64 letters, digits, '_' or '-'");
    for (const ToolSpec& other : *specs)
      if (other.name == spec.name)
        bad(param + ".function.name", fmt::format("two tools are named '{}'", spec.name));
    if (f.contains("description")) {
      if (!f["description"].is_string())
        bad(param + ".function.description", "'description' must be a string");
      spec.description = f["description"].get<std::string>();
    }
    const json parameters = f.contains("parameters") ? f["parameters"] : json{{"type", "object"}};
    if (!parameters.is_object() || !parameters.contains("type") || parameters["type"] != "object")
      bad(param + ".function.parameters",
          "a tool's 'parameters' must be a JSON Schema of type object");
    spec.parameters = compile_json_schema(parameters, param + ".function.parameters");
    spec.parameters_json = f.contains("parameters")
                               ? ordered_tools[i]["function"]["parameters"].dump()
                               : parameters.dump();
    specs->push_back(std::move(spec));
  }
  if (mode == "named") {
    const auto it = std::find_if(specs->begin(), specs->end(),
                                 [&](const ToolSpec& s) { return s.name == named; });
    if (it == specs->end())
      bad("tool_choice", fmt::format("'tool_choice' names '{}', which is not in 'tools'", named));
  }
  out.tools = specs;
  out.completion.render_special = true;  // the call markers are control tokens
  if (mode == "required" || mode == "named") {
    std::shared_ptr<const std::vector<ToolSpec>> callable = specs;
    if (mode == "named") {
      auto one = std::make_shared<std::vector<ToolSpec>>();
      for (const ToolSpec& s : *specs)
        if (s.name == named) one->push_back(s);
      callable = one;
    }
    const ChatTemplateKind kind = context.chat_template;
    out.completion.constraint = [kind, callable] { return one_tool_call(kind, callable); };
  }
  ToolPrompt prompt{.system = tool_system_prompt(context.chat_template, *specs), .listed = {}};
  if (prompt.system.empty())  // the template lists them
    for (const auto& tool : ordered_tools) prompt.listed.push_back(python_json(tool));
  return prompt;
}

}  // namespace

std::string apply_template_response(std::string_view body_text, const PromptContext& context) {
  const json body = parse_body(body_text);
  ParsedRequest unused;
  const ToolPrompt tools = parse_tools(body, body_text, context, unused);
  return json{{"prompt", render_chat(body, context, tools).text}}.dump(
      -1, ' ', false, json::error_handler_t::replace);
}

ParsedRequest parse_chat_request(std::string_view body_text, const PromptContext& context) {
  const json body = parse_body(body_text);
  ParsedRequest out;
  const ToolPrompt tools = parse_tools(body, body_text, context, out);
  ChatPrompt prompt = render_chat(body, context, tools);
  out.chat_options = std::move(prompt.options);
  // The reply opens inside a reasoning block where the prompt opened one: R1's and V3.1's
  // templates add no generation prompt after tool results.
  const bool opens_reasoning =
      prompt.text.ends_with("<think>\n") || prompt.text.ends_with("<think>");
  out.starts_in_reasoning =
      opens_reasoning && reply_starts_in_reasoning(context.chat_template, out.chat_options);
  const auto encode = [&] {
    out.completion.prompt =
        context.tokenizer.encode(prompt.text, {.add_bos = false, .parse_special = true});
  };
  encode();

  out.logprobs = boolean(body, "logprobs", false);
  const int64_t top = integer(body, "top_logprobs", 0, 0, 20);
  if (field(body, "top_logprobs") && !out.logprobs)
    bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  out.completion.top_logprobs = out.logprobs ? int32_t(top) : -1;
  parse_common(body, context, "messages", out);
  // A constrained reply (JSON, a required call) is the answer from its first token: the prompt
  // gets the empty reasoning block the model writes when it does not think.
  if (out.completion.constraint) {
    std::string opened = open_answer_without_reasoning(context.chat_template, prompt.text);
    if (opened != prompt.text) {
      prompt.text = std::move(opened);
      encode();
    }
    out.starts_in_reasoning = false;
  }
  return out;
}

ParsedRequest parse_completion_request(std::string_view body_text, const PromptContext& context) {
  const json body = parse_body(body_text);
  const json* prompt = field(body, "prompt");
  if (!prompt) bad("prompt", "'prompt' is required");
  ParsedRequest out;
  const Tokenizer& tokenizer = context.tokenizer;
  const auto encode = [&](const std::string& text) {
    return tokenizer.encode(text, {.add_bos = tokenizer.add_bos_by_default(), .parse_special = false});
  };
  if (prompt->is_string()) {
    out.completion.prompt = encode(prompt->get<std::string>());
  } else if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) {
    out.completion.prompt = encode((*prompt)[0].get<std::string>());
  } else if (prompt->is_array() && !prompt->empty() &&
             std::all_of(prompt->begin(), prompt->end(), [](const json& t) { return t.is_number_integer(); })) {
    for (const json& t : *prompt) {
      const int64_t id = t.get<int64_t>();
      if (id < 0 || id >= tokenizer.n_vocab())
        bad("prompt", fmt::format("token id {} is outside the vocabulary (0..{})", id, tokenizer.n_vocab() - 1));
      out.completion.prompt.push_back(int32_t(id));
    }
  } else {
    bad("prompt", "'prompt' must be a string, a list with one string, or a list of token ids");
  }
  // Completions' logprobs is an integer: how many alternatives per token (0..5).
  if (const json* v = field(body, "logprobs")) {
    if (!v->is_number_integer()) bad("logprobs", "'logprobs' must be an integer in [0, 5]");
    out.completion.top_logprobs = int32_t(integer(body, "logprobs", 0, 0, 5));
    out.logprobs = true;
  }
  parse_common(body, context, "prompt", out);
  return out;
}

}  // namespace tandem::server

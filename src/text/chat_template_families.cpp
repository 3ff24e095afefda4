// The chat templates of Qwen (ChatML, Qwen3's thinking switch), gpt-oss (Harmony), GLM-4.5 and
// Kimi-K2, each as its model's own template renders plain conversations (chat_template.h).
#include <chrono>
#include <ctime>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/chat_template_internal.h"
#include "text/tool_calls.h"

namespace tandem::chat {
namespace {

constexpr std::string_view kThinkStart = "<think>";
constexpr std::string_view kThinkEnd = "</think>";

// An assistant turn's reasoning and answer as Qwen3's and GLM's templates take them apart: the
// given reasoning_content, or the text before "</think>" (after "<think>") and the text after.
struct SplitTurn {
  std::string reasoning;
  std::string content;
};

SplitTurn split_reasoning(const ChatMessage& m) {
  if (m.reasoning_content) return {*m.reasoning_content, m.content};
  const std::string_view content = m.content;
  if (content.find(kThinkEnd) == std::string_view::npos) return {"", m.content};
  const std::string_view before = rstrip(before_first(content, kThinkEnd), "\n");
  return {std::string(lstrip(after_last(before, kThinkStart), "\n")),
          std::string(lstrip(after_last(content, kThinkEnd), "\n"))};
}

// Qwen3's "last query": the last user message that is not a tool response wrapped in
// <tool_response> tags, or the last message when there is none.
int64_t qwen3_last_query(std::span<const ChatMessage> messages) {
  for (size_t i = messages.size(); i-- > 0;) {
    const std::string_view c = messages[i].content;
    if (messages[i].role == "user" &&
        !(c.starts_with("<tool_response>") && c.ends_with("</tool_response>")))
      return int64_t(i);
  }
  return int64_t(messages.size()) - 1;
}

// The index of the last user message, or -1.
int64_t last_user_index(std::span<const ChatMessage> messages) {
  int64_t last = -1;
  for (size_t i = 0; i < messages.size(); ++i)
    if (messages[i].role == "user") last = int64_t(i);
  return last;
}

std::string today_utc() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[16];
  std::strftime(text, sizeof text, "%Y-%m-%d", &utc);
  return text;
}

}  // namespace

// ChatML: a system prompt first stays first; in Qwen3's template an assistant turn after the last
// user message keeps its reasoning in a <think> block (an empty one when it has none and is the
// last turn), earlier turns keep only their answer.
std::string render_chatml(std::span<const ChatMessage> messages, const ChatOptions& options,
                          bool qwen3) {
  std::string out;
  const int64_t last_query = qwen3 ? qwen3_last_query(messages) : last_user_index(messages);
  size_t first = 0;
  if (qwen3 && !options.tools.empty()) {
    // Qwen3's template lists the tools in the system message, after the system prompt if any.
    out += "<|im_start|>system\n";
    if (!messages.empty() && messages[0].role == "system") {
      out += messages[0].content + "\n\n";
      first = 1;
    }
    out +=
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are "
        "provided with function signatures within <tools></tools> XML tags:\n<tools>";
    for (const std::string& tool : options.tools) out += "\n" + tool;
    out +=
        "\n</tools>\n\nFor each function call, return a json object with function name and "
        "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
        "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n";
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "tool") {  // consecutive results share one user turn
      if (i == 0 || messages[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
      if (i + 1 == messages.size() || messages[i + 1].role != "tool") out += "<|im_end|>\n";
      continue;
    }
    if (m.role != "assistant") {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      continue;
    }
    out += "<|im_start|>assistant\n";
    if (!qwen3) {
      out += m.content + "<|im_end|>\n";
      continue;
    }
    const SplitTurn turn = split_reasoning(m);
    const bool last = i + 1 == messages.size();
    if (int64_t(i) > last_query && (last || !turn.reasoning.empty())) {
      out += "<think>\n";
      out += strip(turn.reasoning, "\n");
      out += "\n</think>\n\n";
      out += lstrip(turn.content, "\n");
    } else {
      out += turn.content;
    }
    for (size_t k = 0; k < m.tool_calls.size(); ++k) {
      if (k > 0 || !turn.content.empty()) out += "\n";
      out += "<tool_call>\n{\"name\": \"" + m.tool_calls[k].name +
             "\", \"arguments\": " + m.tool_calls[k].arguments + "}\n</tool_call>";
    }
    out += "<|im_end|>\n";
  }
  if (options.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (qwen3 && options.enable_thinking == false) out += "<think>\n\n</think>\n\n";
  }
  return out;
}

// Harmony: the system message, the first message's system prompt as the developer's
// instructions (later system messages are not part of the format), then the turns; a closing
// assistant turn ends with <|return|> when no reply is asked for.
std::string render_harmony(std::span<const ChatMessage> messages, const ChatOptions& options) {
  if (options.reasoning_effort != "low" && options.reasoning_effort != "medium" &&
      options.reasoning_effort != "high")
    fail("reasoning effort '{}' is not one of low, medium, high", options.reasoning_effort);
  std::string out =
      "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
      "Knowledge cutoff: 2024-06\nCurrent date: ";
  out += options.date.empty() ? today_utc() : options.date;
  out += "\n\nReasoning: ";
  out += options.reasoning_effort;
  out +=
      "\n\n# Valid channels: analysis, commentary, final. Channel must be included for every "
      "message.<|end|>";
  size_t first = 0;
  if (!messages.empty() && messages[0].role == "system") {
    if (!messages[0].content.empty())
      out +=
          "<|start|>developer<|message|># Instructions\n\n" + messages[0].content + "\n\n<|end|>";
    first = 1;
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user") {
      out += "<|start|>user<|message|>" + m.content + "<|end|>";
    } else if (m.role == "assistant") {
      // Reasoning is never rendered back (gpt-oss's template drops it from earlier turns and
      // reads it from a `thinking` field only for a closing training turn).
      const bool closing = i + 1 == messages.size() && !options.add_generation_prompt;
      out += "<|start|>assistant<|channel|>final<|message|>" + m.content +
             (closing ? "<|return|>" : "<|end|>");
    }
  }
  if (options.add_generation_prompt) out += "<|start|>assistant";
  return out;
}

// GLM-4.5/4.6: every assistant turn opens a <think> block (empty unless it comes after the last
// user message and has reasoning); its answer is stripped of surrounding whitespace. Tools are
// listed in a system message first; calls follow the answer as key/value tags
// (text/xml_tool_calls.h), results come in an observation turn. An assistant turn with null
// content renders as an empty one (GLM's template would write "None").
std::string render_glm45(std::span<const ChatMessage> messages, const ChatOptions& options) {
  const bool no_think = options.enable_thinking == false;
  const int64_t last_user = last_user_index(messages);
  std::string out = "[gMASK]<sop>";
  if (!options.tools.empty()) {
    out +=
        "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user "
        "query.\n\nYou are provided with function signatures within <tools></tools> XML "
        "tags:\n<tools>\n";
    for (const std::string& tool : options.tools) out += tool + "\n";
    out +=
        "</tools>\n\nFor each function call, output the function name and arguments within the "
        "following XML format:\n<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n"
        "<arg_value>{arg-value-1}</arg_value>\n<arg_key>{arg-key-2}</arg_key>\n"
        "<arg_value>{arg-value-2}</arg_value>\n...\n</tool_call>";
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "tool") {
      if (i == 0 || messages[i - 1].role != "tool") out += "<|observation|>";
      out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
    } else if (m.role == "system") {
      out += "<|system|>\n" + m.content;
    } else if (m.role == "user") {
      out += "<|user|>\n" + m.content;
      if (no_think && !std::string_view(m.content).ends_with("/nothink")) out += "/nothink";
    } else {
      const SplitTurn turn = split_reasoning(m);
      out += "<|assistant|>";
      out += "\n<think>";
      if (int64_t(i) > last_user && !turn.reasoning.empty()) out += strip(turn.reasoning);
      out += "</think>";
      if (!strip(turn.content).empty()) {
        out += "\n";
        out += strip(turn.content);
      }
      for (const ChatToolCall& call : m.tool_calls) {
        const auto args = nlohmann::ordered_json::parse(call.arguments, nullptr, false);
        if (args.is_discarded() || !args.is_object())
          fail("tool call '{}' has arguments that are not a JSON object: {}", call.name,
               call.arguments);
        out += "\n<tool_call>" + call.name;
        for (const auto& [key, value] : args.items()) {
          out += "\n<arg_key>" + key + "</arg_key>\n<arg_value>";
          out += value.is_string() ? value.get<std::string>() : python_json(value);
          out += "</arg_value>";
        }
        out += "\n</tool_call>";
      }
    }
  }
  if (options.add_generation_prompt)
    out += no_think ? "<|assistant|>\n<think></think>" : "<|assistant|>";
  return out;
}

// Kimi-K2: role tags around every message, Kimi's own system prompt when the first message is
// not a system prompt.
std::string render_kimi_k2(std::span<const ChatMessage> messages, const ChatOptions& options) {
  std::string out;
  if (!messages.empty() && messages[0].role != "system")
    out += "<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|>";
  for (const ChatMessage& m : messages) {
    if (m.role == "system")
      out += "<|im_system|>system<|im_middle|>";
    else if (m.role == "user")
      out += "<|im_user|>user<|im_middle|>";
    else
      out += "<|im_assistant|>assistant<|im_middle|>";
    out += m.content + "<|im_end|>";
  }
  if (options.add_generation_prompt) out += "<|im_assistant|>assistant<|im_middle|>";
  return out;
}

}  // namespace tandem::chat

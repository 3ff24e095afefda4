// The chat template kinds: names, detection, and the DeepSeek family's renderers (the other
// families are in chat_template_families.cpp).
#include "text/chat_template.h"

#include <array>

#include "core/error.h"
#include "text/chat_template_internal.h"
#include "text/tool_calls.h"

namespace tandem {
namespace chat {

Role parse_role(const ChatMessage& message, size_t index) {
  if (message.role == "system") return Role::System;
  if (message.role == "user") return Role::User;
  if (message.role == "assistant") return Role::Assistant;
  if (message.role == "tool") return Role::Tool;
  fail("chat message {} has role '{}'; the chat templates accept system, user, assistant and tool",
       index, message.role);
}

std::string_view strip(std::string_view s, std::string_view chars) {
  const size_t first = s.find_first_not_of(chars);
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(chars) - first + 1);
}

std::string_view lstrip(std::string_view s, std::string_view chars) {
  const size_t first = s.find_first_not_of(chars);
  return first == std::string_view::npos ? std::string_view() : s.substr(first);
}

std::string_view rstrip(std::string_view s, std::string_view chars) {
  const size_t last = s.find_last_not_of(chars);
  return last == std::string_view::npos ? std::string_view() : s.substr(0, last + 1);
}

std::string_view after_last(std::string_view s, std::string_view marker) {
  const size_t at = s.rfind(marker);
  return at == std::string_view::npos ? s : s.substr(at + marker.size());
}

std::string_view before_first(std::string_view s, std::string_view marker) {
  return s.substr(0, s.find(marker));
}

}  // namespace chat

namespace {

using chat::Role;
constexpr std::string_view kUser = "<｜User｜>";
constexpr std::string_view kAssistant = "<｜Assistant｜>";
constexpr std::string_view kEndOfSentence = "<｜end▁of▁sentence｜>";
constexpr std::string_view kThinkEnd = "</think>";

std::string render_v2(std::span<const ChatMessage> messages, bool add_generation_prompt,
                      const std::string& bos_text) {
  std::string out = bos_text;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    switch (chat::parse_role(m, i)) {
      case Role::Tool:  // refused before rendering (apply_chat_template)
      case Role::System:
        out += m.content;
        out += "\n\n";
        break;
      case Role::User:
        out += "User: ";
        out += m.content;
        out += "\n\n";
        break;
      case Role::Assistant:
        out += "Assistant: ";
        out += m.content;
        out += kEndOfSentence;
        break;
    }
  }
  // No space after the colon: the model's first token carries its own leading space.
  if (add_generation_prompt) out += "Assistant:";
  return out;
}

enum class V3Variant { V3, R1, V31 };

// V3, R1 and V3.1 share the layout: system prompts hoisted right after BOS, then the turns.
std::string render_v3_family(std::span<const ChatMessage> messages, const ChatOptions& options,
                             const std::string& bos_text, V3Variant variant) {
  std::string system_prompt;
  bool first_system = true;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (chat::parse_role(messages[i], i) != Role::System) continue;
    if (variant == V3Variant::R1) {
      system_prompt = messages[i].content;  // R1's template keeps only the last one
    } else {
      if (!first_system) system_prompt += "\n\n";
      system_prompt += messages[i].content;
    }
    first_system = false;
  }
  // V3.1 marks each reply after a user turn as thinking or not.
  const bool thinking = options.enable_thinking.value_or(false);
  std::string out = bos_text;
  out += system_prompt;
  bool last_was_user = false;
  // V3's and R1's tool markup, quirks included: `first_call` and `first_output` are set once for
  // the whole conversation, and the calls' closing tokens follow only a second call of a turn.
  // V3.1's closes every turn's calls and writes results bare, with no generation prompt after them.
  bool in_tool_outputs = false, first_call = true, first_output = true;
  for (const ChatMessage& m : messages) {
    if (m.role == "user") {
      in_tool_outputs = false;
      out += kUser;
      out += m.content;
      last_was_user = true;
    } else if (m.role == "assistant" && variant == V3Variant::V31 && !m.tool_calls.empty()) {
      if (last_was_user) out += std::string(kAssistant) + std::string(kThinkEnd);
      for (size_t k = 0; k < m.tool_calls.size(); ++k) {
        if (k == 0) {
          if (!m.content_is_null) out += m.content;
          out += "<｜tool▁calls▁begin｜>";
        }
        out += "<｜tool▁call▁begin｜>" + m.tool_calls[k].name + "<｜tool▁sep｜>" +
               m.tool_calls[k].arguments + "<｜tool▁call▁end｜>";
      }
      out += "<｜tool▁calls▁end｜>";
      out += kEndOfSentence;
      in_tool_outputs = false;
      last_was_user = false;
    } else if (m.role == "assistant" && variant != V3Variant::V31 && m.content_is_null) {
      in_tool_outputs = false;
      for (const ChatToolCall& call : m.tool_calls) {
        const std::string body =
            call.name + "\n```json\n" + call.arguments + "\n```<｜tool▁call▁end｜>";
        if (first_call) {
          out += kAssistant;
          out += "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>" + body;
          first_call = false;
        } else {
          out += "\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>" + body;
          out += "<｜tool▁calls▁end｜>";
          out += kEndOfSentence;
        }
      }
      last_was_user = false;
    } else if (m.role == "assistant" && in_tool_outputs) {
      if (variant != V3Variant::V31) out += "<｜tool▁outputs▁end｜>";
      out += m.content;
      out += kEndOfSentence;
      in_tool_outputs = false;
      last_was_user = false;
    } else if (m.role == "tool" && variant == V3Variant::V31) {
      in_tool_outputs = true;
      last_was_user = false;
      out += "<｜tool▁output▁begin｜>" + m.content + "<｜tool▁output▁end｜>";
    } else if (m.role == "tool") {
      in_tool_outputs = true;
      out += first_output ? "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>"
                          : "\n<｜tool▁output▁begin｜>";
      out += m.content;
      out += "<｜tool▁output▁end｜>";
      first_output = false;
    } else if (m.role == "assistant") {
      if (variant != V3Variant::V31 || last_was_user) out += kAssistant;
      if (variant == V3Variant::V31 && last_was_user) out += kThinkEnd;
      std::string_view content = m.content;
      if (variant == V3Variant::R1) content = chat::after_last(content, kThinkEnd);
      if (variant == V3Variant::V31 && content.find(kThinkEnd) != std::string_view::npos)
        content = content.substr(content.find(kThinkEnd) + kThinkEnd.size());
      out += content;
      out += kEndOfSentence;
      last_was_user = false;
    }
  }
  if (in_tool_outputs && variant != V3Variant::V31) out += "<｜tool▁outputs▁end｜>";
  if (options.add_generation_prompt && !in_tool_outputs) {
    if (variant == V3Variant::V31) {
      if (last_was_user) out += std::string(kAssistant) + (thinking ? "<think>" : "</think>");
    } else {
      out += kAssistant;
      if (variant == V3Variant::R1) out += "<think>\n";
    }
  }
  return out;
}

struct NamedKind {
  std::string_view name;
  ChatTemplateKind kind;
};

// Canonical names first (chat_template_name), then aliases.
constexpr std::array<NamedKind, 14> kNames = {{
    {"deepseek2", ChatTemplateKind::DeepSeekV2},
    {"deepseek3", ChatTemplateKind::DeepSeekV3},
    {"deepseek-r1", ChatTemplateKind::DeepSeekR1},
    {"deepseek-v3.1", ChatTemplateKind::DeepSeekV31},
    {"chatml", ChatTemplateKind::ChatML},
    {"qwen3", ChatTemplateKind::Qwen3},
    {"gpt-oss", ChatTemplateKind::Harmony},
    {"glm4.5", ChatTemplateKind::Glm45},
    {"kimi-k2", ChatTemplateKind::KimiK2},
    {"deepseek-v2", ChatTemplateKind::DeepSeekV2},
    {"deepseek-v3", ChatTemplateKind::DeepSeekV3},
    {"deepseekr1", ChatTemplateKind::DeepSeekR1},
    {"harmony", ChatTemplateKind::Harmony},
    {"glm4moe", ChatTemplateKind::Glm45},
}};

}  // namespace

std::string apply_chat_template(ChatTemplateKind kind, std::span<const ChatMessage> messages,
                                const ChatOptions& options, const std::string& bos_text) {
  for (size_t i = 0; i < messages.size(); ++i) chat::parse_role(messages[i], i);
  if (!supports_tool_calls(kind))
    for (size_t i = 0; i < messages.size(); ++i)
      if (messages[i].role == "tool" || !messages[i].tool_calls.empty())
        fail(
            "chat message {} has a tool {}; the {} chat template does not render tool calls yet "
            "(DeepSeek V3's, R1's and V3.1's, Qwen3's and GLM-4.5's do)",
            i, messages[i].role == "tool" ? "result" : "call", chat_template_name(kind));
  switch (kind) {
    case ChatTemplateKind::DeepSeekV2:
      return render_v2(messages, options.add_generation_prompt, bos_text);
    case ChatTemplateKind::DeepSeekV3:
      return render_v3_family(messages, options, bos_text, V3Variant::V3);
    case ChatTemplateKind::DeepSeekR1:
      return render_v3_family(messages, options, bos_text, V3Variant::R1);
    case ChatTemplateKind::DeepSeekV31:
      return render_v3_family(messages, options, bos_text, V3Variant::V31);
    case ChatTemplateKind::ChatML:
      return chat::render_chatml(messages, options, /*qwen3=*/false);
    case ChatTemplateKind::Qwen3:
      return chat::render_chatml(messages, options, /*qwen3=*/true);
    case ChatTemplateKind::Harmony:
      return chat::render_harmony(messages, options);
    case ChatTemplateKind::Glm45:
      return chat::render_glm45(messages, options);
    case ChatTemplateKind::KimiK2:
      return chat::render_kimi_k2(messages, options);
  }
  fail("unknown chat template kind {}", int(kind));
}

std::string apply_chat_template(ChatTemplateKind kind, std::span<const ChatMessage> messages,
                                bool add_generation_prompt, const std::string& bos_text) {
  return apply_chat_template(kind, messages,
                             ChatOptions{.add_generation_prompt = add_generation_prompt}, bos_text);
}

std::optional<ChatTemplateKind> detect_chat_template(std::string_view source) {
  auto has = [&](std::string_view marker) { return source.find(marker) != std::string_view::npos; };
  // V2 and Coder-V2 spell the roles out as plain text and end assistant turns with eos_token.
  if (has("'Assistant: ' + message['content'] + eos_token") ||
      (has("'User: '") && has("'Assistant:'") && has("eos_token")))
    return ChatTemplateKind::DeepSeekV2;
  // V2.5, V3, V3.1 and R1 use the fullwidth-bar role tokens; V3.1 has a thinking switch, R1
  // strips reasoning. Kimi-K2 files keep deepseek2's architecture but have their own template.
  if (has(kUser) && has(kAssistant)) {
    if (has("thinking is defined")) return ChatTemplateKind::DeepSeekV31;
    if (has(kThinkEnd)) return ChatTemplateKind::DeepSeekR1;
    return ChatTemplateKind::DeepSeekV3;
  }
  if (has("<|im_system|>") && has("<|im_middle|>")) return ChatTemplateKind::KimiK2;
  if (has("<|start|>") && has("<|channel|>") && has("<|message|>"))
    return ChatTemplateKind::Harmony;
  if (has("[gMASK]<sop>") && has("<|assistant|>")) return ChatTemplateKind::Glm45;
  // Qwen3's template keeps reasoning in <think> blocks and has the enable_thinking switch; plain
  // ChatML (Qwen2.5, Qwen3's Instruct-2507 releases) has neither.
  // Qwen2.5's template adds a default system prompt of its own: not claimed.
  if (has("<|im_start|>") && has("<|im_end|>") && has("'<|im_start|>' + message.role") &&
      !has("You are Qwen, created by Alibaba Cloud")) {
    if (has("<think>")) return ChatTemplateKind::Qwen3;
    return ChatTemplateKind::ChatML;
  }
  return std::nullopt;
}

ChatTemplateKind chat_template_from_name(std::string_view name) {
  for (const NamedKind& n : kNames)
    if (n.name == name) return n.kind;
  fail(
      "unknown chat template '{}'; known names: deepseek2 (deepseek-v2), deepseek3 (deepseek-v3), "
      "deepseek-r1, deepseek-v3.1, chatml, qwen3, gpt-oss (harmony), glm4.5 (glm4moe), kimi-k2",
      name);
}

std::string_view chat_template_name(ChatTemplateKind kind) {
  for (const NamedKind& n : kNames)
    if (n.kind == kind) return n.name;
  return "unknown";
}

std::string open_answer_without_reasoning(ChatTemplateKind kind, std::string prompt) {
  switch (kind) {
    case ChatTemplateKind::DeepSeekR1:  // "<think>\n\n</think>\n\n", as R1 writes a reply without
      if (prompt.ends_with("<think>\n")) prompt += "\n</think>\n\n";
      break;
    case ChatTemplateKind::DeepSeekV31:  // its non-thinking reply opening instead
      if (prompt.ends_with("<think>"))
        prompt.replace(prompt.size() - std::string_view("<think>").size(), std::string::npos,
                       "</think>");
      break;
    case ChatTemplateKind::Qwen3:  // the block its template writes with thinking off
      if (prompt.ends_with("<|im_start|>assistant\n")) prompt += "<think>\n\n</think>\n\n";
      break;
    case ChatTemplateKind::Glm45:  // as its template renders an answer without reasoning
      if (prompt.ends_with("<|assistant|>"))
        prompt += "\n<think></think>\n";
      else if (prompt.ends_with("<|assistant|>\n<think></think>"))
        prompt += "\n";
      break;
    default:
      break;
  }
  return prompt;
}

bool reply_starts_in_reasoning(ChatTemplateKind kind, const ChatOptions& options) {
  if (kind == ChatTemplateKind::DeepSeekR1) return true;
  return kind == ChatTemplateKind::DeepSeekV31 && options.enable_thinking.value_or(false);
}

}  // namespace tandem

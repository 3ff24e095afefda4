#include "text/chat_template.h"

#include "core/error.h"

namespace tandem {
namespace {

constexpr std::string_view kUser = "<｜User｜>";
constexpr std::string_view kAssistant = "<｜Assistant｜>";
constexpr std::string_view kEndOfSentence = "<｜end▁of▁sentence｜>";
constexpr std::string_view kThinkEnd = "</think>";

enum class Role { System, User, Assistant };

Role parse_role(const ChatMessage& message, size_t index) {
  if (message.role == "system") return Role::System;
  if (message.role == "user") return Role::User;
  if (message.role == "assistant") return Role::Assistant;
  fail(
      "chat message {} has role '{}'; the DeepSeek chat templates accept system, user and "
      "assistant",
      index, message.role);
}

// What R1's template keeps of an earlier assistant turn: the text after the last "</think>"
// (Jinja's content.split('</think>')[-1]), whitespace included.
std::string_view strip_reasoning(std::string_view content) {
  const size_t end = content.rfind(kThinkEnd);
  if (end == std::string_view::npos) return content;
  return content.substr(end + kThinkEnd.size());
}

std::string render_v2(std::span<const ChatMessage> messages, bool add_generation_prompt,
                      const std::string& bos_text) {
  std::string out = bos_text;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    switch (parse_role(m, i)) {
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

// V3 and R1 share the layout: system prompts hoisted right after BOS, then the turns.
std::string render_v3_family(std::span<const ChatMessage> messages, bool add_generation_prompt,
                             const std::string& bos_text, bool r1) {
  std::string system_prompt;
  bool first_system = true;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (parse_role(messages[i], i) != Role::System) continue;
    if (r1) {
      system_prompt = messages[i].content;  // R1's template keeps only the last one
    } else {
      if (!first_system) system_prompt += "\n\n";
      system_prompt += messages[i].content;
    }
    first_system = false;
  }

  std::string out = bos_text;
  out += system_prompt;
  for (const ChatMessage& m : messages) {
    if (m.role == "user") {
      out += kUser;
      out += m.content;
    } else if (m.role == "assistant") {
      out += kAssistant;
      out += r1 ? strip_reasoning(m.content) : std::string_view(m.content);
      out += kEndOfSentence;
    }
  }
  if (add_generation_prompt) {
    out += kAssistant;
    if (r1) out += "<think>\n";
  }
  return out;
}

}  // namespace

std::string apply_chat_template(ChatTemplateKind kind, std::span<const ChatMessage> messages,
                                bool add_generation_prompt, const std::string& bos_text) {
  switch (kind) {
    case ChatTemplateKind::DeepSeekV2:
      return render_v2(messages, add_generation_prompt, bos_text);
    case ChatTemplateKind::DeepSeekV3:
      return render_v3_family(messages, add_generation_prompt, bos_text, /*r1=*/false);
    case ChatTemplateKind::DeepSeekR1:
      return render_v3_family(messages, add_generation_prompt, bos_text, /*r1=*/true);
  }
  fail("unknown chat template kind {}", int(kind));
}

std::optional<ChatTemplateKind> detect_chat_template(std::string_view source) {
  auto has = [&](std::string_view marker) { return source.find(marker) != std::string_view::npos; };
  // V2 and Coder-V2 spell the roles out as plain text and end assistant turns with eos_token.
  if (has("'Assistant: ' + message['content'] + eos_token") ||
      (has("'User: '") && has("'Assistant:'") && has("eos_token")))
    return ChatTemplateKind::DeepSeekV2;
  // V2.5, V3 and R1 use the fullwidth-bar role tokens; R1 alone strips reasoning. V3.1-style
  // hybrid templates (a `thinking` switch, "</think>" after the assistant tag) render
  // differently from all three kinds, so they are not claimed.
  if (has(kUser) && has(kAssistant)) {
    if (has("thinking is defined")) return std::nullopt;
    if (has(kThinkEnd)) return ChatTemplateKind::DeepSeekR1;
    return ChatTemplateKind::DeepSeekV3;
  }
  return std::nullopt;
}

ChatTemplateKind chat_template_from_name(std::string_view name) {
  if (name == "deepseek2" || name == "deepseek-v2") return ChatTemplateKind::DeepSeekV2;
  if (name == "deepseek3" || name == "deepseek-v3") return ChatTemplateKind::DeepSeekV3;
  if (name == "deepseek-r1" || name == "deepseekr1") return ChatTemplateKind::DeepSeekR1;
  fail(
      "unknown chat template '{}'; known names: deepseek2 (deepseek-v2), deepseek3 "
      "(deepseek-v3), deepseek-r1",
      name);
}

std::string_view chat_template_name(ChatTemplateKind kind) {
  switch (kind) {
    case ChatTemplateKind::DeepSeekV2:
      return "deepseek2";
    case ChatTemplateKind::DeepSeekV3:
      return "deepseek3";
    case ChatTemplateKind::DeepSeekR1:
      return "deepseek-r1";
  }
  return "unknown";
}

}  // namespace tandem

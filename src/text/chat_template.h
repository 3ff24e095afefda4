#pragma once
// Chat prompts for the DeepSeek family, written out in C++ instead of interpreting Jinja: the
// output is byte for byte what each model's own `tokenizer.chat_template` renders for plain
// system/user/assistant conversations (tool calls are not supported yet).
//
//   DeepSeekV2  (V2-Chat, V2-Lite-Chat, Coder-V2-Instruct)
//     BOS, then in message order: system "S\n\n", user "User: U\n\n",
//     assistant "Assistant: A<｜end▁of▁sentence｜>"; generation prompt "Assistant:".
//   DeepSeekV3  (V3, V3-0324, V2.5)
//     BOS, all system prompts joined by "\n\n", then "<｜User｜>U" and
//     "<｜Assistant｜>A<｜end▁of▁sentence｜>"; generation prompt "<｜Assistant｜>".
//   DeepSeekR1  (R1)
//     As V3, except: only the last system prompt is used, earlier assistant turns keep only the
//     text after their last "</think>", and the generation prompt is "<｜Assistant｜><think>\n"
//     (R1's template opens the reasoning block itself).
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace tandem {

enum class ChatTemplateKind { DeepSeekV2, DeepSeekV3, DeepSeekR1 };

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

// The prompt text (special tokens written as text, to be tokenized with special-token parsing).
// `bos_text` is the BOS token's text, e.g. "<｜begin▁of▁sentence｜>". Throws tandem::Error for a
// role other than system/user/assistant, naming it.
std::string apply_chat_template(ChatTemplateKind kind, std::span<const ChatMessage> messages,
                                bool add_generation_prompt, const std::string& bos_text);

// Recognises the DeepSeek templates by distinctive markers; nullopt for anything else.
std::optional<ChatTemplateKind> detect_chat_template(std::string_view jinja_source);

// For `--chat-template NAME`: deepseek2 (alias deepseek-v2), deepseek3 (alias deepseek-v3),
// deepseek-r1 (alias deepseekr1). Throws tandem::Error listing the names otherwise.
ChatTemplateKind chat_template_from_name(std::string_view name);

// The canonical name of a kind ("deepseek2", "deepseek3", "deepseek-r1").
std::string_view chat_template_name(ChatTemplateKind kind);

}  // namespace tandem

#pragma once
// Internal to text/chat_template*.cpp: the renderers of each family and the few string helpers
// that mirror the Python string methods the templates use.
#include <span>
#include <string>
#include <string_view>

#include "text/chat_template.h"

namespace tandem::chat {

enum class Role { System, User, Assistant, Tool };
// Throws an Error naming a role other than system, user, assistant and tool.
Role parse_role(const ChatMessage& message, size_t index);

// Python's str.strip(chars), lstrip, rstrip; whitespace by default.
constexpr std::string_view kWhitespace = " \t\n\r\f\v";
std::string_view strip(std::string_view s, std::string_view chars = kWhitespace);
std::string_view lstrip(std::string_view s, std::string_view chars = kWhitespace);
std::string_view rstrip(std::string_view s, std::string_view chars = kWhitespace);
// s.split(marker)[-1] and s.split(marker)[0].
std::string_view after_last(std::string_view s, std::string_view marker);
std::string_view before_first(std::string_view s, std::string_view marker);

std::string render_chatml(std::span<const ChatMessage> messages, const ChatOptions& options,
                          bool qwen3);
std::string render_harmony(std::span<const ChatMessage> messages, const ChatOptions& options);
std::string render_glm45(std::span<const ChatMessage> messages, const ChatOptions& options);
std::string render_kimi_k2(std::span<const ChatMessage> messages, const ChatOptions& options);

}  // namespace tandem::chat

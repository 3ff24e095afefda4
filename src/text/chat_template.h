#pragma once
// Chat prompts of the model families tandem runs, written out in C++ instead of interpreting
// Jinja: the output is byte for byte what each model's own `tokenizer.chat_template` renders (with
// transformers' settings) for conversations of system, user and assistant messages, and for
// the tool calls, tool results and tool lists of the DeepSeek V3, R1 and V3.1 templates, Qwen3's
// and GLM-4.5's (gpt-oss and Kimi-K2 refuse them for now). tests/text/chat checks this against
// jinja2 rendering the fixtures' own templates.
//
//   DeepSeekV2   (V2-Chat, V2-Lite-Chat, Coder-V2-Instruct)
//     BOS, then in message order: system "S\n\n", user "User: U\n\n",
//     assistant "Assistant: A<｜end▁of▁sentence｜>"; generation prompt "Assistant:".
//   DeepSeekV3   (V3, V3-0324, V2.5)
//     BOS, all system prompts joined by "\n\n", then "<｜User｜>U" and
//     "<｜Assistant｜>A<｜end▁of▁sentence｜>"; generation prompt "<｜Assistant｜>".
//   DeepSeekR1   (R1)
//     As V3, except: only the last system prompt is used, earlier assistant turns keep only the
//     text after their last "</think>", and the generation prompt is "<｜Assistant｜><think>\n".
//   DeepSeekV31  (V3.1, V3.1-Terminus; thinking off by default)
//     As V3, with "</think>" (or "<think>" when thinking) after an assistant tag that follows a
//     user turn, and earlier reasoning cut at the first "</think>".
//   ChatML       (Qwen3's Instruct-2507 and Coder releases)
//   "<|im_start|>role\ncontent<|im_end|>\n". Qwen3        (Qwen3 with its thinking switch) ChatML,
//   with the reasoning of the turns after
//     the last user message kept in <think> blocks, and "<think>\n\n</think>\n\n" opening the
//     reply when thinking is off.
//   Harmony      (gpt-oss) a system message (identity, knowledge cutoff, today's date, reasoning
//     effort, channels), the first system prompt as the developer's instructions, then
//     "<|start|>user<|message|>U<|end|>" and
//     "<|start|>assistant<|channel|>final<|message|>A<|end|>"; generation prompt
//     "<|start|>assistant".
//   Glm45        (GLM-4.5, 4.5-Air, 4.6) "[gMASK]<sop>", "<|system|>\nS", "<|user|>\nU",
//     "<|assistant|>\n<think>R</think>\nA"; "/nothink" after user turns when thinking is off.
//   KimiK2       (Kimi-K2-Instruct) "<|im_system|>system<|im_middle|>S<|im_end|>" and the like,
//     with Kimi's default system prompt when the conversation has none.
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

enum class ChatTemplateKind {
  DeepSeekV2,
  DeepSeekV3,
  DeepSeekR1,
  DeepSeekV31,
  ChatML,
  Qwen3,
  Harmony,
  Glm45,
  KimiK2,
};

// A function call an assistant turn made (OpenAI's tool_calls[i]).
struct ChatToolCall {
  std::string id;  // "call_..." as the reply gave it
  std::string name;
  std::string arguments;  // JSON text
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" or "tool" (a call's result)
  std::string content;
  // An assistant turn that only calls tools has no content (OpenAI's null), which templates
  // render differently from an empty one.
  bool content_is_null = false;
  std::vector<ChatToolCall> tool_calls = {};
  // An assistant turn's reasoning given apart from its content (OpenAI clients that keep
  // `reasoning_content`); without it, templates look for <think> blocks in the content.
  std::optional<std::string> reasoning_content = std::nullopt;
};

struct ChatOptions {
  bool add_generation_prompt = true;
  // Thinking on or off for the templates with a switch (Qwen3, GLM-4.5, DeepSeek-V3.1); nullopt:
  // the template's own default (on for Qwen3 and GLM, off for V3.1).
  std::optional<bool> enable_thinking = std::nullopt;
  std::string reasoning_effort = "medium";  // Harmony: low, medium or high
  std::string date;  // Harmony's "Current date" (YYYY-MM-DD); empty: today, UTC
  // The tools offered, each as the template's `tool | tojson` writes it (python_json in
  // text/tool_calls.h), for templates that list them themselves (Qwen3).
  std::vector<std::string> tools = {};
};

// The prompt text (special tokens written as text, to be tokenized with special-token parsing).
// `bos_text` is the BOS token's text, e.g. "<｜begin▁of▁sentence｜>". Throws tandem::Error for a
// role other than system/user/assistant/tool, naming it, and for tool calls or results in a
// template that does not render them yet.
std::string apply_chat_template(ChatTemplateKind kind, std::span<const ChatMessage> messages,
                                const ChatOptions& options, const std::string& bos_text);
std::string apply_chat_template(ChatTemplateKind kind, std::span<const ChatMessage> messages,
                                bool add_generation_prompt, const std::string& bos_text);

// Recognises a model's template by distinctive markers; nullopt for anything else.
std::optional<ChatTemplateKind> detect_chat_template(std::string_view jinja_source);

// For `--chat-template NAME`: deepseek2 (alias deepseek-v2), deepseek3 (deepseek-v3), deepseek-r1,
// deepseek-v3.1, chatml, qwen3, gpt-oss (harmony), glm4.5 (glm4moe), kimi-k2. Throws
// tandem::Error listing the names otherwise.
ChatTemplateKind chat_template_from_name(std::string_view name);

// The canonical name of a kind ("deepseek2", "qwen3", "gpt-oss", ...).
std::string_view chat_template_name(ChatTemplateKind kind);

// A prompt (ending in its generation prompt) made to open a reply that is the answer from its
// first token, for constrained replies (JSON, a required tool call): the empty reasoning block
// each template writes when the model does not think, closing one the prompt opened (R1, V3.1
// thinking) or standing where the model would open its own (Qwen3, GLM-4.5). Other prompts are
// returned as they are.
std::string open_answer_without_reasoning(ChatTemplateKind kind, std::string prompt);

// Whether the template opens the reply inside a reasoning block (R1, Qwen3 and GLM when thinking,
// V3.1 when asked): the reply's text then starts with reasoning that ends at "</think>".
bool reply_starts_in_reasoning(ChatTemplateKind kind, const ChatOptions& options);

}  // namespace tandem

#include "text/chat_template.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/error.h"
#include "test_support.h"

namespace tandem {
namespace {

const std::string kBos = "<｜begin▁of▁sentence｜>";

// The fixture's `tokenizer.chat_template` (the real DeepSeek-V3 template), found by scanning the
// GGUF bytes for the key: after it come a u32 type (8 = string), a u64 length and the text.
// A scan keeps this test independent of the GGUF reader.
std::string fixture_chat_template() {
  const std::string bytes = test::read_text_file(test::fixture("micro-v3-F32.gguf"));
  const std::string key = "tokenizer.chat_template";
  const size_t at = bytes.find(key);
  if (at == std::string::npos || at + key.size() + 12 > bytes.size()) {
    ADD_FAILURE() << "no tokenizer.chat_template in micro-v3-F32.gguf";
    return {};
  }
  uint32_t type = 0;
  uint64_t length = 0;
  std::memcpy(&type, bytes.data() + at + key.size(), 4);
  std::memcpy(&length, bytes.data() + at + key.size() + 4, 8);
  EXPECT_EQ(type, 8u);
  return bytes.substr(at + key.size() + 12, size_t(length));
}

std::string render(ChatTemplateKind kind, const std::vector<ChatMessage>& messages,
                   bool add_generation_prompt) {
  return apply_chat_template(kind, messages, add_generation_prompt, kBos);
}

// A conversation with system prompts before and between turns, and an assistant turn that
// carries reasoning. Expected texts below were produced by rendering the models' Jinja templates.
const std::vector<ChatMessage> kConversation = {
    {"system", "Be brief."},
    {"user", "Hi"},
    {"assistant", "<think>greet back</think>\n\nHello!"},
    {"system", "Use English."},
    {"user", "Sea?"},
};

TEST(ChatTemplate, V3SingleUserMessageMatchesTheFixturePrompt) {
  const std::vector<ChatMessage> messages = {
      {"user", "Write a short poem about the sea, in English and 中文."}};
  EXPECT_EQ(render(ChatTemplateKind::DeepSeekV3, messages, true),
            "<｜begin▁of▁sentence｜><｜User｜>Write a short poem about the sea, in English and "
            "中文.<｜Assistant｜>");
}

TEST(ChatTemplate, V3HoistsAndJoinsSystemPromptsAndKeepsReasoning) {
  EXPECT_EQ(render(ChatTemplateKind::DeepSeekV3, kConversation, true),
            kBos +
                "Be brief.\n\nUse English.<｜User｜>Hi<｜Assistant｜><think>greet back</think>\n\n"
                "Hello!<｜end▁of▁sentence｜><｜User｜>Sea?<｜Assistant｜>");
}

TEST(ChatTemplate, V3EndsAssistantTurnsWithEndOfSentence) {
  const std::vector<ChatMessage> messages = {{"user", "Hi"}, {"assistant", "Hello"}};
  EXPECT_EQ(render(ChatTemplateKind::DeepSeekV3, messages, false),
            kBos + "<｜User｜>Hi<｜Assistant｜>Hello<｜end▁of▁sentence｜>");
  EXPECT_EQ(render(ChatTemplateKind::DeepSeekV3, {}, false), kBos);
}

TEST(ChatTemplate, V2WritesRolesAsTextWithSystemPromptsInPlace) {
  EXPECT_EQ(render(ChatTemplateKind::DeepSeekV2, kConversation, true),
            kBos +
                "Be brief.\n\nUser: Hi\n\nAssistant: <think>greet back</think>\n\n"
                "Hello!<｜end▁of▁sentence｜>Use English.\n\nUser: Sea?\n\nAssistant:");
  const std::vector<ChatMessage> messages = {{"user", "Hi"}, {"assistant", "Hello"}};
  EXPECT_EQ(render(ChatTemplateKind::DeepSeekV2, messages, false),
            kBos + "User: Hi\n\nAssistant: Hello<｜end▁of▁sentence｜>");
}

TEST(ChatTemplate, R1StripsEarlierReasoningAndOpensThinking) {
  EXPECT_EQ(render(ChatTemplateKind::DeepSeekR1, kConversation, true),
            kBos +
                "Use English.<｜User｜>Hi<｜Assistant｜>\n\nHello!<｜end▁of▁sentence｜>"
                "<｜User｜>Sea?<｜Assistant｜><think>\n");
  // Only the text after the last </think> survives; a turn without one is untouched.
  const std::vector<ChatMessage> messages = {
      {"user", "a"}, {"assistant", "x</think>y</think>answer"}, {"user", "b"}, {"assistant", "c"}};
  EXPECT_EQ(render(ChatTemplateKind::DeepSeekR1, messages, false),
            kBos +
                "<｜User｜>a<｜Assistant｜>answer<｜end▁of▁sentence｜><｜User｜>b<｜Assistant｜>c"
                "<｜end▁of▁sentence｜>");
}

TEST(ChatTemplate, UnknownRoleIsAnErrorNamingIt) {
  const std::vector<ChatMessage> messages = {{"user", "a"}, {"robot", "42"}};
  for (auto kind :
       {ChatTemplateKind::DeepSeekV2, ChatTemplateKind::DeepSeekV3, ChatTemplateKind::DeepSeekR1}) {
    try {
      render(kind, messages, true);
      ADD_FAILURE() << "role 'robot' accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'robot'"), std::string::npos) << e.what();
    }
  }
  // Tool results: the templates with tool calls in tandem render them, the others refuse them.
  const std::vector<ChatMessage> result = {{"user", "a"}, {"tool", "42"}};
  EXPECT_NO_THROW(render(ChatTemplateKind::DeepSeekV3, result, true));
  EXPECT_NO_THROW(render(ChatTemplateKind::DeepSeekR1, result, true));
  for (auto kind : {ChatTemplateKind::DeepSeekV2, ChatTemplateKind::KimiK2}) try {
      render(kind, result, true);
      ADD_FAILURE() << "a tool result accepted by " << chat_template_name(kind);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("tool result"), std::string::npos) << e.what();
    }
}

TEST(ChatTemplate, DetectsTheFixtureV3Template) {
  const std::string source = fixture_chat_template();
  ASSERT_FALSE(source.empty());
  EXPECT_EQ(detect_chat_template(source), ChatTemplateKind::DeepSeekV3);
}

TEST(ChatTemplate, DetectsR1AndV2ByTheirMarkers) {
  // R1's template is V3's with reasoning stripped from assistant turns.
  std::string r1 = fixture_chat_template();
  r1 +=
      "{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}";
  EXPECT_EQ(detect_chat_template(r1), ChatTemplateKind::DeepSeekR1);
  // V3.1's hybrid template has a thinking switch.
  EXPECT_EQ(detect_chat_template(r1 + "{%- if not thinking is defined -%}"),
            ChatTemplateKind::DeepSeekV31);

  const std::string v2 =
      "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
      "{{ 'User: ' + message['content'] + '\\n\\n' }}{% elif message['role'] == 'assistant' %}"
      "{{ 'Assistant: ' + message['content'] + eos_token }}{% endif %}{% endfor %}"
      "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}";
  EXPECT_EQ(detect_chat_template(v2), ChatTemplateKind::DeepSeekV2);
}

// Kimi-K2 and DeepSeek-V3.1 have no fixture model: expected texts rendered with jinja2 from the
// models' own templates (as tests/text/chat/render_with_jinja.py does for the fixtures').
TEST(ChatTemplate, KimiK2AddsItsDefaultSystemPromptOnlyWithoutOne) {
  const std::vector<ChatMessage> plain = {{"user", "Hi"}};
  EXPECT_EQ(render(ChatTemplateKind::KimiK2, plain, true),
            "<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|>"
            "<|im_user|>user<|im_middle|>Hi<|im_end|><|im_assistant|>assistant<|im_middle|>");
  const std::vector<ChatMessage> with_system = {{"system", ""}, {"user", "x"}};
  EXPECT_EQ(render(ChatTemplateKind::KimiK2, with_system, true),
            "<|im_system|>system<|im_middle|><|im_end|><|im_user|>user<|im_middle|>x<|im_end|>"
            "<|im_assistant|>assistant<|im_middle|>");
}

TEST(ChatTemplate, V31MarksRepliesAfterUserTurnsAndSwitchesThinking) {
  const std::vector<ChatMessage> messages = {{"system", "Be kind.\n"},
                                             {"user", "a"},
                                             {"assistant", "<think>r</think>b"},
                                             {"assistant", "c"},
                                             {"user", "d"}};
  EXPECT_EQ(render(ChatTemplateKind::DeepSeekV31, messages, true),
            kBos +
                "Be kind.\n<｜User｜>a<｜Assistant｜></think>b<｜end▁of▁sentence｜>c"
                "<｜end▁of▁sentence｜><｜User｜>d<｜Assistant｜></think>");
  const std::vector<ChatMessage> one = {{"user", "Hi"}};
  EXPECT_EQ(
      apply_chat_template(ChatTemplateKind::DeepSeekV31, one, {.enable_thinking = true}, kBos),
      kBos + "<｜User｜>Hi<｜Assistant｜><think>");
  EXPECT_TRUE(reply_starts_in_reasoning(ChatTemplateKind::DeepSeekV31, {.enable_thinking = true}));
  EXPECT_FALSE(reply_starts_in_reasoning(ChatTemplateKind::DeepSeekV31, {}));
}

// A tool round trip: a call with no content, its two results, the answer, another question.
std::vector<ChatMessage> tool_round_trip() {
  ChatMessage call{"assistant",
                   "",
                   /*content_is_null=*/true,
                   {{"call_1", "f", R"({"a": 1})"}, {"call_2", "g", "{}"}}};
  return {{"system", "S"}, {"user", "q"},       call,          {"tool", "r1"},
          {"tool", "r2"},  {"assistant", "ok"}, {"user", "q2"}};
}

// Expected strings follow R1's tokenizer_config.json template (the January 2025 release), which
// renders tools as V3's does: only the last system prompt, reasoning stripped from plain turns.
TEST(ChatTemplate, R1RendersToolCallsAsV3Does) {
  const std::string call_1 =
      "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": 1}\n```<｜tool▁call▁end｜>";
  const std::string call_2 =
      "<｜tool▁call▁begin｜>function<｜tool▁sep｜>g\n```json\n{}\n```<｜tool▁call▁end｜>";
  EXPECT_EQ(render(ChatTemplateKind::DeepSeekR1, tool_round_trip(), true),
            kBos + "S<｜User｜>q<｜Assistant｜><｜tool▁calls▁begin｜>" + call_1 + "\n" + call_2 +
                "<｜tool▁calls▁end｜><｜end▁of▁sentence｜><｜tool▁outputs▁begin｜><"
                "｜tool▁output▁begin｜>r1"
                "<｜tool▁output▁end｜>\n<｜tool▁output▁begin｜>r2<｜tool▁output▁end｜><"
                "｜tool▁outputs▁end｜>ok"
                "<｜end▁of▁sentence｜><｜User｜>q2<｜Assistant｜><think>\n");
  // Right after a result: the outputs close and no generation prompt follows.
  std::vector<ChatMessage> pending = tool_round_trip();
  pending.resize(4);
  EXPECT_TRUE(render(ChatTemplateKind::DeepSeekR1, pending, true)
                  .ends_with("r1<｜tool▁output▁end｜><｜tool▁outputs▁end｜>"));
}

// Expected strings follow V3.1's template: calls as NAME<｜tool▁sep｜>ARGUMENTS closed per turn,
// results bare, the answer after them without an assistant tag.
TEST(ChatTemplate, V31RendersToolCallsInItsOwnSyntax) {
  EXPECT_EQ(
      render(ChatTemplateKind::DeepSeekV31, tool_round_trip(), true),
      kBos +
          "S<｜User｜>q<｜Assistant｜></think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f"
          "<｜tool▁sep｜>{\"a\": 1}<｜tool▁call▁end｜><｜tool▁call▁begin｜>g<｜tool▁sep｜>{}"
          "<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜><｜tool▁output▁begin｜>r1"
          "<｜tool▁output▁end｜><｜tool▁output▁begin｜>r2<｜tool▁output▁end｜>ok"
          "<｜end▁of▁sentence｜><｜User｜>q2<｜Assistant｜></think>");
  std::vector<ChatMessage> with_text = tool_round_trip();
  with_text[2].content = "Checking.";
  with_text[2].content_is_null = false;
  with_text.resize(4);
  EXPECT_EQ(
      render(ChatTemplateKind::DeepSeekV31, with_text, true),
      kBos +
          "S<｜User｜>q<｜Assistant｜></think>Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f"
          "<｜tool▁sep｜>{\"a\": 1}<｜tool▁call▁end｜><｜tool▁call▁begin｜>g<｜tool▁sep｜>{}"
          "<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜><｜tool▁output▁begin｜>r1"
          "<｜tool▁output▁end｜>");
}

TEST(ChatTemplate, AConstrainedAnswerOpensWithTheEmptyReasoningBlockOfEachTemplate) {
  const std::vector<ChatMessage> q = {{"user", "q"}};
  auto opened = [&](ChatTemplateKind kind, ChatOptions options) {
    return open_answer_without_reasoning(kind, apply_chat_template(kind, q, options, kBos));
  };

  EXPECT_TRUE(opened(ChatTemplateKind::DeepSeekR1, {}).ends_with("<think>\n\n</think>\n\n"));
  EXPECT_TRUE(opened(ChatTemplateKind::DeepSeekV31, {.enable_thinking = true})
                  .ends_with("<｜Assistant｜></think>"));
  EXPECT_TRUE(opened(ChatTemplateKind::Qwen3, {})
                  .ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  // Thinking off already writes the block: nothing is added twice.
  const std::string qwen_off =
      apply_chat_template(ChatTemplateKind::Qwen3, q, {.enable_thinking = false}, kBos);
  EXPECT_EQ(open_answer_without_reasoning(ChatTemplateKind::Qwen3, qwen_off), qwen_off);
  EXPECT_TRUE(opened(ChatTemplateKind::Glm45, {}).ends_with("<|assistant|>\n<think></think>\n"));
  EXPECT_TRUE(opened(ChatTemplateKind::Glm45, {.enable_thinking = false})
                  .ends_with("<|assistant|>\n<think></think>\n"));
  const std::string v3 = apply_chat_template(ChatTemplateKind::DeepSeekV3, q, {}, kBos);
  EXPECT_EQ(open_answer_without_reasoning(ChatTemplateKind::DeepSeekV3, v3), v3);
}

TEST(ChatTemplate, DetectsEachFamilyByItsMarkers) {
  EXPECT_EQ(detect_chat_template("{{'<|im_system|>system<|im_middle|>'}}"),
            ChatTemplateKind::KimiK2);
  EXPECT_EQ(detect_chat_template("<|start|>{{x}}<|channel|>final<|message|>"),
            ChatTemplateKind::Harmony);
  EXPECT_EQ(detect_chat_template("[gMASK]<sop>{{'<|assistant|>'}}"), ChatTemplateKind::Glm45);
  const std::string chatml =
      "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' }}";
  EXPECT_EQ(detect_chat_template(chatml), ChatTemplateKind::ChatML);
  EXPECT_EQ(detect_chat_template(chatml + "{{ '<think>' }}"), ChatTemplateKind::Qwen3);
  // Qwen2.5 adds a default system prompt of its own: not claimed.
  EXPECT_EQ(detect_chat_template(chatml + "You are Qwen, created by Alibaba Cloud."), std::nullopt);
}

TEST(ChatTemplate, DetectionRejectsOtherTemplates) {
  EXPECT_EQ(detect_chat_template(""), std::nullopt);
  EXPECT_EQ(detect_chat_template("garbage {{ not a template"), std::nullopt);
  EXPECT_EQ(detect_chat_template("{% for message in messages %}<|im_start|>{{ message['role'] }}"
                                 "\n{{ message['content'] }}<|im_end|>{% endfor %}"),
            std::nullopt);
}

TEST(ChatTemplate, NamesAndAliases) {
  EXPECT_EQ(chat_template_from_name("deepseek2"), ChatTemplateKind::DeepSeekV2);
  EXPECT_EQ(chat_template_from_name("deepseek-v2"), ChatTemplateKind::DeepSeekV2);
  EXPECT_EQ(chat_template_from_name("deepseek3"), ChatTemplateKind::DeepSeekV3);
  EXPECT_EQ(chat_template_from_name("deepseek-v3"), ChatTemplateKind::DeepSeekV3);
  EXPECT_EQ(chat_template_from_name("deepseek-r1"), ChatTemplateKind::DeepSeekR1);
  for (auto kind :
       {ChatTemplateKind::DeepSeekV2, ChatTemplateKind::DeepSeekV3, ChatTemplateKind::DeepSeekR1})
    EXPECT_EQ(chat_template_from_name(chat_template_name(kind)), kind);
  EXPECT_EQ(chat_template_from_name("chatml"), ChatTemplateKind::ChatML);
  EXPECT_EQ(chat_template_from_name("harmony"), ChatTemplateKind::Harmony);
  for (auto kind :
       {ChatTemplateKind::DeepSeekV31, ChatTemplateKind::ChatML, ChatTemplateKind::Qwen3,
        ChatTemplateKind::Harmony, ChatTemplateKind::Glm45, ChatTemplateKind::KimiK2})
    EXPECT_EQ(chat_template_from_name(chat_template_name(kind)), kind);
  try {
    chat_template_from_name("llama3");
    ADD_FAILURE();
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("llama3"), std::string::npos) << message;
    EXPECT_NE(message.find("deepseek2"), std::string::npos) << message;
    EXPECT_NE(message.find("kimi-k2"), std::string::npos) << message;
    EXPECT_NE(message.find("deepseek3"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace tandem

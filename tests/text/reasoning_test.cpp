// Reasoning told apart from the answer (text/reasoning.h): whole replies, and the same replies cut
// into pieces at every byte, which must give the same two texts (markers split across pieces are
// held back, never leaked into either side).
#include "text/reasoning.h"

#include <gtest/gtest.h>

#include <string>

namespace tandem {
namespace {

struct Split {
  std::string reasoning, content;
};

Split whole(ReasoningFormat format, bool in_reasoning, const std::string& text) {
  ReasoningSplitter s(format, in_reasoning);
  Split out;
  for (const ReasoningSplitter::Delta& d : {s.push(text), s.finish()}) {
    out.reasoning += d.reasoning;
    out.content += d.content;
  }
  return out;
}

// Every way of cutting the text in two, and one byte at a time, gives the whole reply's split.
void expect_split(ReasoningFormat format, bool in_reasoning, const std::string& text,
                  const std::string& reasoning, const std::string& content) {
  const Split w = whole(format, in_reasoning, text);
  EXPECT_EQ(w.reasoning, reasoning) << text;
  EXPECT_EQ(w.content, content) << text;
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    ReasoningSplitter s(format, in_reasoning);
    Split got;
    for (const ReasoningSplitter::Delta& d :
         {s.push(text.substr(0, cut)), s.push(text.substr(cut)), s.finish()}) {
      got.reasoning += d.reasoning;
      got.content += d.content;
    }
    ASSERT_EQ(got.reasoning, reasoning) << "cut at " << cut << ": " << text;
    ASSERT_EQ(got.content, content) << "cut at " << cut << ": " << text;
  }
  ReasoningSplitter s(format, in_reasoning);
  Split bytes;
  for (char c : text) {
    const ReasoningSplitter::Delta d = s.push(std::string(1, c));
    bytes.reasoning += d.reasoning, bytes.content += d.content;
  }
  const ReasoningSplitter::Delta d = s.finish();
  EXPECT_EQ(bytes.reasoning + d.reasoning, reasoning) << "byte by byte: " << text;
  EXPECT_EQ(bytes.content + d.content, content) << "byte by byte: " << text;
}

TEST(Reasoning, ThinkBlockAtTheStartIsReasoning) {
  expect_split(ReasoningFormat::Think, false, "<think>\nLet me see.\n</think>\n\nIt is 4.",
               "Let me see.", "It is 4.");
  expect_split(ReasoningFormat::Think, false, "  <think>a</think>b", "a", "b");
  expect_split(ReasoningFormat::Think, false, "<think>\n\n</think>\n\nOnly the answer.", "",
               "Only the answer.");
}

TEST(Reasoning, PromptThatOpenedTheBlockMakesTheStartReasoning) {
  // R1: the prompt ends with "<think>\n".
  expect_split(ReasoningFormat::Think, true, "Hmm, 2+2.\n</think>\n\n4", "Hmm, 2+2.", "4");
  // The reply ended before </think>: all of it was reasoning.
  expect_split(ReasoningFormat::Think, true, "still thinking ", "still thinking", "");
}

TEST(Reasoning, TextWithoutABlockIsTheAnswerUnchanged) {
  expect_split(ReasoningFormat::Think, false, "Plain answer </think> here", "",
               "Plain answer </think> here");
  expect_split(ReasoningFormat::Think, false, "<thin", "", "<thin");
  expect_split(ReasoningFormat::None, false, "<think>x</think>y", "", "<think>x</think>y");
}

TEST(Reasoning, HarmonyAnalysisIsReasoningAndFinalTheAnswer) {
  expect_split(ReasoningFormat::Harmony, false,
               "<|channel|>analysis<|message|>User wants a poem.<|end|><|start|>assistant"
               "<|channel|>final<|message|>The sea is wide.",
               "User wants a poem.", "The sea is wide.");
  // A reply straight to the final channel; one whose header carries more after the name.
  expect_split(ReasoningFormat::Harmony, false, "<|channel|>final<|message|>Hi!", "", "Hi!");
  expect_split(ReasoningFormat::Harmony, false,
               "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}", "", "{}");
}

TEST(Reasoning, HarmonyThatIsNotHarmonyIsKeptAsText) {
  expect_split(ReasoningFormat::Harmony, false, "Hello there", "", "Hello there");
  expect_split(ReasoningFormat::Harmony, false, "<|channel|>analysis", "", "<|channel|>analysis");
  expect_split(ReasoningFormat::Harmony, false, "<|channel|>analysis<|message|>half a thought",
               "half a thought", "");
}

TEST(Reasoning, FormatsFollowTheTemplates) {
  EXPECT_EQ(reasoning_format_of(ChatTemplateKind::Harmony), ReasoningFormat::Harmony);
  EXPECT_EQ(reasoning_format_of(ChatTemplateKind::DeepSeekR1), ReasoningFormat::Think);
  EXPECT_EQ(reasoning_format_of(ChatTemplateKind::Qwen3), ReasoningFormat::Think);
  EXPECT_EQ(reasoning_format_of(ChatTemplateKind::DeepSeekV3), ReasoningFormat::None);
  EXPECT_EQ(reasoning_format_of(ChatTemplateKind::KimiK2), ReasoningFormat::None);
}

}  // namespace
}  // namespace tandem

#pragma once
// A reply's reasoning told apart from its answer, as the text streams out (the OpenAI API's
// `reasoning_content`, DeepSeek's shape):
//   Think    the reasoning between <think> and </think> (R1, V3.1, Qwen3, GLM-4.5): at the start
//            of the reply, or from the first byte when the prompt already opened the block;
//   Harmony  gpt-oss's channels: "<|channel|>analysis<|message|>...<|end|>" is reasoning,
//            "<|start|>assistant<|channel|>final<|message|>..." the answer.
// Text that does not follow the format goes to the answer unchanged, never dropped. Markers split
// across pieces are held back until they are whole.
#include <string>
#include <string_view>

#include "text/chat_template.h"

namespace tandem {

enum class ReasoningFormat { None, Think, Harmony };

// The format a template's replies take: Harmony for gpt-oss, Think for the templates with
// reasoning blocks, None for the rest.
ReasoningFormat reasoning_format_of(ChatTemplateKind kind);

class ReasoningSplitter {
 public:
  // `starts_in_reasoning`: the prompt ended inside a reasoning block (R1's "<think>\n").
  ReasoningSplitter(ReasoningFormat format, bool starts_in_reasoning);

  struct Delta {
    std::string reasoning, content;
    bool empty() const { return reasoning.empty() && content.empty(); }
  };
  // The reasoning and answer text that `piece` completes.
  Delta push(std::string_view piece);
  // Whatever is still held back (the reply ended).
  Delta finish();

 private:
  enum class State {
    Start,          // nothing seen yet (Think: a leading <think> may come)
    Reasoning,      // inside reasoning, until </think> (Think) or <|end|> (Harmony analysis)
    AnswerStart,    // after </think>: whitespace before the answer is dropped
    Answer,         // the answer, to the end (Think) or to <|end|> (Harmony final)
    HarmonyHeader,  // between <|channel|> (or <|start|>) and <|message|>
  };
  void run(Delta& out, bool at_end);
  // Harmony: the body of a message ends at <|end|>; then a new header may start.
  void harmony(Delta& out, bool at_end);

  ReasoningFormat format_;
  State state_;
  std::string pending_;  // text not yet given out
  std::string header_;   // Harmony: the current message's header
  bool reasoning_channel_ = false;
  size_t reasoning_given_ = 0;  // Think: reasoning bytes given out so far
  bool plain_ = false;  // Harmony: the reply did not follow the format; all of it is the answer
};

}  // namespace tandem

#include "text/reasoning.h"

#include <algorithm>

namespace tandem {
namespace {

constexpr std::string_view kThinkStart = "<think>";
constexpr std::string_view kThinkEnd = "</think>";
constexpr std::string_view kChannel = "<|channel|>";
constexpr std::string_view kMessage = "<|message|>";
constexpr std::string_view kEnd = "<|end|>";
constexpr std::string_view kStart = "<|start|>";
// A Harmony header longer than this without its <|message|> is not a header.
constexpr size_t kMaxHeader = 256;

// The length of the longest suffix of `text` that is a proper prefix of `marker`: bytes that
// may turn into the marker once more text comes.
size_t partial_marker(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n)
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

// Moves `text` up to `marker` into `out` and drops the marker: true if it was there. Without it,
// moves all but a possible start of the marker (all of it at the end of the reply).
bool take_until(std::string& text, std::string_view marker, std::string& out, bool at_end) {
  const size_t at = text.find(marker);
  if (at != std::string::npos) {
    out.append(text, 0, at);
    text.erase(0, at + marker.size());
    return true;
  }
  const size_t keep = at_end ? 0 : partial_marker(text, marker);
  out.append(text, 0, text.size() - keep);
  text.erase(0, text.size() - keep);
  return false;
}

// Whether `header` (the text of a Harmony header so far) can still be or is one:
// [<|start|>assistant]<|channel|>NAME...
bool harmony_header_so_far(std::string_view header) {
  constexpr std::string_view kRole = "<|start|>assistant";
  if (kRole.starts_with(header)) return true;
  if (header.starts_with(kRole)) header.remove_prefix(kRole.size());
  return kChannel.starts_with(header) || header.starts_with(kChannel);
}

}  // namespace

ReasoningFormat reasoning_format_of(ChatTemplateKind kind) {
  switch (kind) {
    case ChatTemplateKind::Harmony:
      return ReasoningFormat::Harmony;
    case ChatTemplateKind::DeepSeekR1:
    case ChatTemplateKind::DeepSeekV31:
    case ChatTemplateKind::Qwen3:
    case ChatTemplateKind::Glm45:
      return ReasoningFormat::Think;
    default:
      return ReasoningFormat::None;
  }
}

ReasoningSplitter::ReasoningSplitter(ReasoningFormat format, bool starts_in_reasoning)
    : format_(format),
      state_(format == ReasoningFormat::Harmony                        ? State::HarmonyHeader
             : format == ReasoningFormat::Think && starts_in_reasoning ? State::Reasoning
                                                                       : State::Start) {
  if (format == ReasoningFormat::None) state_ = State::Answer;
}

ReasoningSplitter::Delta ReasoningSplitter::push(std::string_view piece) {
  pending_.append(piece);
  Delta out;
  run(out, /*at_end=*/false);
  return out;
}

ReasoningSplitter::Delta ReasoningSplitter::finish() {
  Delta out;
  run(out, /*at_end=*/true);
  out.content += header_ + pending_;  // an unfinished header or marker is text after all
  header_.clear();
  pending_.clear();
  return out;
}

void ReasoningSplitter::run(Delta& out, bool at_end) {
  if (format_ == ReasoningFormat::Harmony) return harmony(out, at_end);
  for (;;) {
    switch (state_) {
      case State::Start: {
        // A reply that opens with <think> (after whitespace) reasons first; anything else is the
        // answer, whitespace included.
        const std::string_view text = pending_;
        const size_t first = text.find_first_not_of(" \t\r\n");
        if (first == std::string_view::npos && !at_end) return;
        const std::string_view rest = first == std::string_view::npos ? "" : text.substr(first);
        if (rest.starts_with(kThinkStart)) {
          pending_.erase(0, first + kThinkStart.size());
          state_ = State::Reasoning;
          break;
        }
        if (!at_end && kThinkStart.starts_with(rest)) return;  // may still become <think>
        state_ = State::Answer;
        break;
      }
      case State::Reasoning: {
        // Whitespace around the reasoning is dropped: leading at once, trailing by holding it
        // back until text follows it (or </think> shows it was trailing).
        if (out.reasoning.empty() && reasoning_given_ == 0) {
          const size_t first = pending_.find_first_not_of(" \t\r\n");
          pending_.erase(0, first == std::string::npos ? pending_.size() : first);
          if (pending_.empty()) return;
        }
        std::string text;
        const bool ended = take_until(pending_, kThinkEnd, text, at_end);
        const size_t keep =
            ended || at_end ? 0 : text.size() - (text.find_last_not_of(" \t\r\n") + 1);
        if (ended || at_end) text.erase(text.find_last_not_of(" \t\r\n") + 1);
        pending_.insert(0, text, text.size() - keep, keep);
        text.erase(text.size() - keep);
        reasoning_given_ += text.size();
        out.reasoning += text;
        if (!ended) return;
        state_ = State::AnswerStart;
        break;
      }
      case State::AnswerStart: {
        const size_t first = pending_.find_first_not_of(" \t\r\n");
        if (first == std::string::npos) {
          pending_.clear();
          return;
        }
        pending_.erase(0, first);
        state_ = State::Answer;
        break;
      }
      case State::Answer:
      case State::HarmonyHeader:
        out.content += pending_;
        pending_.clear();
        return;
    }
  }
}

void ReasoningSplitter::harmony(Delta& out, bool at_end) {
  for (;;) {
    if (plain_) {  // not Harmony after all: the text is the answer as it stands
      out.content += pending_;
      pending_.clear();
      return;
    }
    if (state_ == State::HarmonyHeader) {
      std::string header;
      const bool complete = take_until(pending_, kMessage, header, at_end);
      header_ += header;
      if (!harmony_header_so_far(header_) || header_.size() > kMaxHeader || (!complete && at_end)) {
        out.content += header_;
        if (complete) out.content += kMessage;
        header_.clear();
        plain_ = true;
        continue;
      }
      if (!complete) return;
      std::string_view name =
          std::string_view(header_).substr(header_.find(kChannel) + kChannel.size());
      name = name.substr(0, name.find_first_of(" <"));
      reasoning_channel_ = name == "analysis";  // final and commentary are the answer's
      header_.clear();
      state_ = reasoning_channel_ ? State::Reasoning : State::Answer;
      continue;
    }
    // A message's body, to <|end|>; then the next message's header.
    std::string& to = reasoning_channel_ ? out.reasoning : out.content;
    if (!take_until(pending_, kEnd, to, at_end)) return;
    state_ = State::HarmonyHeader;
  }
}

}  // namespace tandem

#include "text/tool_calls.h"

#include <algorithm>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/error.h"
#include "text/chat_template_internal.h"
#include "text/literal_match.h"
#include "text/xml_tool_calls.h"

namespace tandem {
namespace {

constexpr std::string_view kCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kSep = "<｜tool▁sep｜>";
constexpr std::string_view kArgsOpen = "\n```json\n";
constexpr std::string_view kArgsClose = "\n```";

std::string concat(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (std::string_view p : parts) out.append(p);
  return out;
}

void check_kind(ChatTemplateKind kind) {
  if (!supports_tool_calls(kind))
    fail("the {} chat template has no tool calls in tandem yet", chat_template_name(kind));
}

using literal::consume;

// The tool-call syntaxes: DeepSeek-V3's (also R1's), V3.1's, Qwen3's and GLM-4.5's key/value tags
// (text/xml_tool_calls.h).
enum class Syntax { V3, V31, Qwen3, Xml };

Syntax syntax_of(ChatTemplateKind kind) {
  if (kind == ChatTemplateKind::Qwen3) return Syntax::Qwen3;
  if (kind == ChatTemplateKind::Glm45) return Syntax::Xml;
  return kind == ChatTemplateKind::DeepSeekV31 ? Syntax::V31 : Syntax::V3;
}

// One call: V3's
// "<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>" or
// V3.1's "<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>".
std::optional<ChatToolCall> parse_call(std::string_view& s, Syntax syntax) {
  const bool v3 = syntax == Syntax::V3;
  if (!consume(s, kCallBegin) || (v3 && (!consume(s, "function") || !consume(s, kSep))))
    return std::nullopt;
  const std::string_view after_name = v3 ? kArgsOpen : kSep;
  const std::string args_close = v3 ? concat({kArgsClose, kCallEnd}) : std::string(kCallEnd);
  const size_t name_end = s.find(after_name);
  if (name_end == std::string_view::npos || name_end == 0) return std::nullopt;
  ChatToolCall call{.id = {}, .name = std::string(s.substr(0, name_end)), .arguments = {}};
  s.remove_prefix(name_end + after_name.size());
  const size_t args_end = s.find(args_close);
  if (args_end == std::string_view::npos) return std::nullopt;
  call.arguments = std::string(s.substr(0, args_end));
  s.remove_prefix(args_end + args_close.size());
  const nlohmann::json args =
      nlohmann::json::parse(call.arguments, nullptr, /*allow_exceptions=*/false);
  if (args.is_discarded() || !args.is_object()) return std::nullopt;
  return call;
}

// A family's call, around its name and its arguments.
struct CallSyntax {
  std::string opening;     // before the name
  std::string after_name;  // between the name and the arguments
  std::string closing;     // after the arguments
};

CallSyntax call_syntax(ChatTemplateKind kind) {
  switch (syntax_of(kind)) {
    case Syntax::Qwen3:
      return {"<tool_call>\n{\"name\": \"", "\", \"arguments\": ", "}\n</tool_call>"};
    case Syntax::V31:
      return {concat({kCallsBegin, kCallBegin}), std::string(kSep), concat({kCallEnd, kCallsEnd})};
    case Syntax::V3:
    case Syntax::Xml:  // a grammar of its own (one_xml_tool_call)
      break;
  }
  return {concat({kCallsBegin, kCallBegin, "function", kSep}), std::string(kArgsOpen),
          concat({kArgsClose, kCallEnd, kCallsEnd})};
}

// The tokens `text` from each position on takes at most: one per byte, but one for each of
// DeepSeek's markers ("<｜tool▁sep｜>", 19 bytes), which its vocabulary holds as single tokens.
// A marker begun byte by byte counts its remaining bytes.
std::vector<int64_t> tokens_from_each_position(std::string_view text) {
  std::vector<int64_t> tokens(text.size() + 1, 0);
  for (size_t from = 0; from < text.size(); ++from) {
    int64_t n = 0;
    for (size_t at = from; at < text.size(); ++n) {
      const size_t end = text.find("｜>", at);
      at = text.substr(at).starts_with("<｜") && end != std::string_view::npos
               ? end + std::string_view("｜>").size()
               : at + 1;
    }
    tokens[from] = n;
  }
  return tokens;
}

// The grammar of one call: the opening, a tool's name, its arguments as JSON of its parameters
// (compact), the closing. min_remaining counts tokens where a marker is one.
class OneToolCall : public OutputConstraint {
 public:
  OneToolCall(std::shared_ptr<const std::vector<ToolSpec>> tools, const CallSyntax& syntax)
      : tools_(std::move(tools)) {
    opening_ = syntax.opening;
    closing_ = syntax.closing;
    opening_tokens_ = tokens_from_each_position(opening_);
    closing_tokens_ = tokens_from_each_position(closing_);
    for (const ToolSpec& t : *tools_) {
      heads_.push_back(t.name + syntax.after_name);
      head_tokens_.push_back(tokens_from_each_position(heads_.back()));
      args_min_.push_back(JsonRecognizer(*t.parameters).min_remaining());
    }
    candidates_ = literal::all_of(heads_.size());
  }
  std::unique_ptr<OutputConstraint> clone() const override {
    return std::make_unique<OneToolCall>(*this);
  }
  void copy_from(const OutputConstraint& other) override {
    const auto& o = static_cast<const OneToolCall&>(other);
    phase_ = o.phase_, pos_ = o.pos_, candidates_ = o.candidates_, chosen_ = o.chosen_;
    if (o.args_) {
      if (args_ && args_schema_ == o.args_schema_)
        *args_ = *o.args_;
      else
        args_ = std::make_unique<JsonRecognizer>(*o.args_), args_schema_ = o.args_schema_;
    } else {
      args_.reset();
    }
  }
  OneToolCall(const OneToolCall& o)
      : OutputConstraint(),
        tools_(o.tools_),
        opening_(o.opening_),
        closing_(o.closing_),
        heads_(o.heads_),
        opening_tokens_(o.opening_tokens_),
        closing_tokens_(o.closing_tokens_),
        head_tokens_(o.head_tokens_),
        args_min_(o.args_min_) {
    copy_from(o);
  }

  bool feed(std::string_view bytes) override {
    for (char c : bytes)
      if (!feed(c)) return false;
    return true;
  }
  bool complete() const override { return phase_ == Phase::Done; }
  int64_t min_remaining() const override {
    switch (phase_) {
      case Phase::Opening:
        return opening_tokens_[size_t(pos_)] + shortest_head_and_args(candidates_, 0) +
               closing_tokens_[0];
      case Phase::Head:
        return shortest_head_and_args(candidates_, pos_) + closing_tokens_[0];
      case Phase::Arguments:
        return args_->min_remaining() + closing_tokens_[0];
      case Phase::Closing:
        return closing_tokens_[size_t(pos_)];
      case Phase::Done:
        return 0;
    }
    return 0;
  }
  // Markers open and close a call (V3.1's closing follows the arguments' last brace) and may end
  // its name (V3.1's separator); a marker's text never matches a name's characters, so only the
  // right one is taken. Inside the arguments JSON, none.
  bool takes_control_tokens() const override {
    return phase_ != Phase::Arguments || args_->complete();
  }

 private:
  enum class Phase { Opening, Head, Arguments, Closing, Done };

  int64_t shortest_head_and_args(uint64_t candidates, int32_t pos) const {
    int64_t best = std::numeric_limits<int64_t>::max();
    for (size_t i = 0; i < heads_.size(); ++i)
      if (candidates >> i & 1) best = std::min(best, head_tokens_[i][size_t(pos)] + args_min_[i]);
    return best;
  }

  bool feed(char c) {
    switch (phase_) {
      case Phase::Opening:
        if (opening_[size_t(pos_)] != c) return false;
        if (++pos_ == int32_t(opening_.size())) phase_ = Phase::Head, pos_ = 0;
        return true;
      case Phase::Head: {
        const uint64_t next = literal::continuing(heads_, candidates_, pos_, c);
        if (!next) return false;
        candidates_ = next;
        ++pos_;
        // No head is a prefix of another: each ends in a text no name holds.
        if (const int32_t i = literal::finished(heads_, next, pos_); i >= 0) {
          chosen_ = i;
          args_schema_ = (*tools_)[size_t(i)].parameters.get();
          args_ = std::make_unique<JsonRecognizer>(*args_schema_);
          phase_ = Phase::Arguments;
        }
        return true;
      }
      case Phase::Arguments:
        if (!args_->complete()) return args_->feed(c);
        phase_ = Phase::Closing, pos_ = 0;
        [[fallthrough]];
      case Phase::Closing:
        if (closing_[size_t(pos_)] != c) return false;
        if (++pos_ == int32_t(closing_.size())) phase_ = Phase::Done;
        return true;
      case Phase::Done:
        return false;
    }
    return false;
  }

  std::shared_ptr<const std::vector<ToolSpec>> tools_;
  std::string opening_, closing_;
  std::vector<std::string> heads_;  // each tool's name and the arguments' opening
  std::vector<int64_t> opening_tokens_, closing_tokens_;  // tokens_from_each_position
  std::vector<std::vector<int64_t>> head_tokens_;
  std::vector<int64_t> args_min_;  // each tool's shortest arguments
  Phase phase_ = Phase::Opening;
  int32_t pos_ = 0;
  uint64_t candidates_ = 0;
  int32_t chosen_ = -1;
  const JsonSchema* args_schema_ = nullptr;
  std::unique_ptr<JsonRecognizer> args_;
};

// Qwen3: "<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>" blocks, one per call,
// after the text.
ToolReply parse_qwen3(std::string_view text) {
  constexpr std::string_view open = "<tool_call>", close = "</tool_call>";
  const size_t begin = text.find(open);
  if (begin == std::string_view::npos) return {std::string(text), {}};
  ToolReply reply{.content = std::string(chat::rstrip(text.substr(0, begin), "\n")), .calls = {}};
  std::string_view rest = text.substr(begin);
  while (!rest.empty()) {
    if (!consume(rest, open)) return {std::string(text), {}};
    const size_t end = rest.find(close);
    if (end == std::string_view::npos) return {std::string(text), {}};
    const auto call = nlohmann::ordered_json::parse(rest.substr(0, end), nullptr, false);
    rest.remove_prefix(end + close.size());
    if (call.is_discarded() || !call.is_object() || !call.contains("name") ||
        !call["name"].is_string() || !call.contains("arguments") || !call["arguments"].is_object())
      return {std::string(text), {}};
    reply.calls.push_back({.id = {},
                           .name = call["name"].get<std::string>(),
                           .arguments = call["arguments"].dump(
                               -1, ' ', false, nlohmann::ordered_json::error_handler_t::replace)});
    rest = chat::lstrip(rest, "\n");
  }
  return reply;
}

std::string_view section_marker(ChatTemplateKind kind) {
  const Syntax syntax = syntax_of(kind);
  return syntax == Syntax::Qwen3 || syntax == Syntax::Xml ? std::string_view("<tool_call>")
                                                          : kCallsBegin;
}

// V3.1's template does not list tools either; its model card gives the description it was trained
// with, which goes after the system prompt.
std::string v31_tool_prompt(std::span<const ToolSpec> tools) {
  std::string out = "## Tools\nYou have access to the following tools:\n";
  for (const ToolSpec& t : tools) {
    out += "\n### " + t.name + "\nDescription: " + t.description + "\n\nParameters: ";
    out += python_json(nlohmann::ordered_json::parse(t.parameters_json));
    out += "\n";
  }
  out +=
      concat({"\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\n", kCallsBegin,
              kCallBegin, "tool_call_name", kSep, "tool_call_arguments", kCallEnd,
              "{{additional_tool_calls}}", kCallsEnd,
              "\n\nWhere:\n\n- `tool_call_name` must be an exact match to one of the available "
              "tools\n- `tool_call_arguments` must be valid JSON that strictly follows the tool's "
              "Parameters Schema\n- For multiple tool calls, chain them directly without "
              "separators or spaces\n"});
  return out;
}

}  // namespace

bool supports_tool_calls(ChatTemplateKind kind) {
  return kind == ChatTemplateKind::DeepSeekV3 || kind == ChatTemplateKind::DeepSeekR1 ||
         kind == ChatTemplateKind::DeepSeekV31 || kind == ChatTemplateKind::Qwen3 ||
         kind == ChatTemplateKind::Glm45;
}

std::vector<std::string_view> single_token_markers(ChatTemplateKind kind) {
  const Syntax syntax = syntax_of(kind);
  if (syntax == Syntax::Qwen3 || syntax == Syntax::Xml) return {};  // budgeted by their bytes
  return {kCallsBegin, kCallBegin, kSep, kCallEnd, kCallsEnd};
}

std::string python_json(const nlohmann::ordered_json& value) {
  using J = nlohmann::ordered_json;
  const auto scalar = [](const J& v) {
    return v.dump(-1, ' ', false, J::error_handler_t::replace);
  };
  std::string out;
  if (value.is_array()) {
    out = "[";
    for (size_t i = 0; i < value.size(); ++i) {
      if (i) out += ", ";
      out += python_json(value[i]);
    }
    return out + "]";
  }
  if (value.is_object()) {
    out = "{";
    bool first = true;
    for (const auto& [key, item] : value.items()) {
      if (!first) out += ", ";
      out += scalar(J(key));
      out += ": ";
      out += python_json(item);
      first = false;
    }
    return out + "}";
  }
  return scalar(value);
}

std::string tool_system_prompt(ChatTemplateKind kind, std::span<const ToolSpec> tools) {
  check_kind(kind);
  if (kind == ChatTemplateKind::Qwen3 || kind == ChatTemplateKind::Glm45)
    return {};  // their templates list the tools themselves
  if (kind == ChatTemplateKind::DeepSeekV31) return v31_tool_prompt(tools);
  std::string out = concat(
      {"You can call functions. To call one, reply with exactly\n", kCallsBegin, kCallBegin,
       "function", kSep, "NAME", kArgsOpen, "ARGUMENTS", kArgsClose, kCallEnd, kCallsEnd,
       "\nwhere ARGUMENTS is a JSON object of the function's parameters. Each result comes back "
       "in a tool output. The functions, one JSON object each:"});
  for (const ToolSpec& t : tools) {
    nlohmann::ordered_json f = {{"name", t.name}};
    if (!t.description.empty()) f["description"] = t.description;
    f["parameters"] = nlohmann::ordered_json::parse(t.parameters_json);
    out += '\n';
    out += f.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  }
  return out;
}

ToolReply parse_tool_reply(ChatTemplateKind kind, std::string_view text,
                           std::span<const ToolSpec> tools) {
  check_kind(kind);
  const Syntax syntax = syntax_of(kind);
  if (syntax == Syntax::Qwen3) return parse_qwen3(text);
  if (syntax == Syntax::Xml) return parse_xml_tool_calls(text, tools);
  const size_t begin = text.find(kCallsBegin);
  if (begin == std::string_view::npos) return {std::string(text), {}};
  ToolReply reply{.content = std::string(text.substr(0, begin)), .calls = {}};
  std::string_view rest = text.substr(begin + kCallsBegin.size());
  for (;;) {
    std::optional<ChatToolCall> call = parse_call(rest, syntax);
    if (!call) return {std::string(text), {}};
    reply.calls.push_back(std::move(*call));
    if (rest.empty() || consume(rest, kCallsEnd)) break;  // a reply cut short after a call counts
    consume(rest, "\n");
  }
  return reply;
}

size_t tool_section_start(ChatTemplateKind kind, std::string_view text) {
  check_kind(kind);
  const std::string_view marker = section_marker(kind);
  const size_t begin = text.find(marker);
  if (begin != std::string_view::npos) return begin;
  // An end of the text that is the start of the marker is held back.
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n)
    if (text.substr(text.size() - n) == marker.substr(0, n)) return text.size() - n;
  return text.size();
}

std::unique_ptr<OutputConstraint> one_tool_call(
    ChatTemplateKind kind, std::shared_ptr<const std::vector<ToolSpec>> tools) {
  check_kind(kind);
  TANDEM_CHECK(!tools->empty() && tools->size() <= 64);
  if (syntax_of(kind) == Syntax::Xml) return one_xml_tool_call(std::move(tools));
  return std::make_unique<OneToolCall>(std::move(tools), call_syntax(kind));
}

}  // namespace tandem

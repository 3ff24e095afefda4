#pragma once
// Tool calls in a model family's own syntax: the tools described in the prompt, the calls parsed
// back out of a reply, and the grammar of one call for `tool_choice: "required"` (gpt-oss's and
// Kimi-K2's templates refuse tools for now). GLM-4.5's syntax is in text/xml_tool_calls.h. Qwen3's
// template lists the tools itself and takes calls as
// "<tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>"; DeepSeek-V3's and R1's:
//
//   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
//   ```json
//   ARGUMENTS
//   ```<｜tool▁call▁end｜>  (more calls: "\n<｜tool▁call▁begin｜>...")  <｜tool▁calls▁end｜>
//
// and V3.1's
// "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGUMENTS<｜tool▁call▁end｜>
// ...<｜tool▁calls▁end｜>". DeepSeek's templates render calls and results but never the tool list,
// so the list goes into the system prompt with the syntax: V3.1's model card gives its wording;
// for V3 and R1 it is tandem's (as llama.cpp does for templates without tool support).
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "text/chat_template.h"
#include "text/json_constraint.h"
#include "text/output_constraint.h"

namespace tandem {

struct ToolSpec {
  std::string name;  // [A-Za-z0-9_-], 1 to 64 characters
  std::string description;
  std::string parameters_json;                   // the JSON Schema as the request gave it
  std::shared_ptr<const JsonSchema> parameters;  // compiled (an object schema)
};

bool supports_tool_calls(ChatTemplateKind kind);

// `value` as Python's json.dumps writes it (", " and ": " separators, no ASCII escaping, keys in
// their order): how Hugging Face templates' `tojson` lists tools.
std::string python_json(const nlohmann::ordered_json& value);

// The markers of the family's call syntax that its budget counts as one token each (DeepSeek's):
// a vocabulary without them as single tokens cannot take tools in that syntax.
std::vector<std::string_view> single_token_markers(ChatTemplateKind kind);

// The system prompt that lists `tools` and shows how to call them.
std::string tool_system_prompt(ChatTemplateKind kind, std::span<const ToolSpec> tools);

// A reply split into its text and its calls (ids left empty). A reply whose call section does
// not parse whole (a broken marker, arguments that are not a JSON object) is all text: nothing
// the model wrote is dropped. `tools` (the tools offered) type GLM's arguments, whose strings are
// written without quotes.
struct ToolReply {
  std::string content;
  std::vector<ChatToolCall> calls;
};
ToolReply parse_tool_reply(ChatTemplateKind kind, std::string_view text,
                           std::span<const ToolSpec> tools = {});

// How much of `text` (a reply so far) can be streamed as content: everything before the call
// section, or before an end that may still become its opening marker.
size_t tool_section_start(ChatTemplateKind kind, std::string_view text);

// The grammar of a reply that is exactly one call of one of `tools`, its arguments following the
// tool's parameters.
std::unique_ptr<OutputConstraint> one_tool_call(ChatTemplateKind kind,
                                                std::shared_ptr<const std::vector<ToolSpec>> tools);

}  // namespace tandem

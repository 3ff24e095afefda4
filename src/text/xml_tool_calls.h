#pragma once
// Tool calls written as key/value tags, GLM-4.5's syntax (also GLM-4.6's):
//
//   <tool_call>NAME
//   <arg_key>KEY</arg_key>
//   <arg_value>VALUE</arg_value>
//   ...
//   </tool_call>
//
// A string argument's VALUE is its raw text; any other is JSON. Whether a value is a string comes
// from the tool's parameters: the same text "12" is the string "12" for a string parameter and
// the number 12 otherwise (for a tool the reply invents, a VALUE that parses as JSON is that JSON).
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "text/output_constraint.h"
#include "text/tool_calls.h"

namespace tandem {

// The calls after the reply's text (which loses its trailing newlines); a call section that does
// not parse whole leaves the reply all text.
ToolReply parse_xml_tool_calls(std::string_view text, std::span<const ToolSpec> tools);

// The grammar of a reply that is exactly one call of one of `tools` (at most 64), its arguments
// those of the tool's parameters: each property at most once, the required ones before the end,
// string values raw (no '<' inside), the others compact JSON of their schema.
std::unique_ptr<OutputConstraint> one_xml_tool_call(
    std::shared_ptr<const std::vector<ToolSpec>> tools);

}  // namespace tandem

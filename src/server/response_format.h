#pragma once
// `response_format` of a request: "text", {"type": "json_object"} (any JSON object) or
// {"type": "json_schema", "json_schema": {"name", "schema", "strict"}} with a schema of the
// common JSON Schema subset: type (object, array, string, number, integer, boolean, null),
// properties, required, additionalProperties false, items, minItems, maxItems, minLength,
// maxLength, enum, const; title, description, default, examples and $schema are read as
// annotations. Anything else gets a 400 naming the keyword's path, never a silent reply that
// ignores it.
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "text/json_constraint.h"

namespace tandem::server {

// The schema the reply must follow, or null for plain text. Throws ApiError (400) naming the field.
std::shared_ptr<const JsonSchema> parse_response_format(const nlohmann::json& body);

// A schema of the subset above, compiled; `path` names it in errors
// ("tools[0].function.parameters").
std::shared_ptr<const JsonSchema> compile_json_schema(const nlohmann::json& schema,
                                                      const std::string& path);

// A schema of the subset above, compiled; `path` names it in errors
// ("tools[0].function.parameters").
std::shared_ptr<const JsonSchema> compile_json_schema(const nlohmann::json& schema,
                                                      const std::string& path);

}  // namespace tandem::server

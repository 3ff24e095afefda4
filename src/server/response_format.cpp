#include "server/response_format.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "server/api_error.h"

namespace tandem::server {
namespace {

using nlohmann::json;
using Kind = JsonSchemaNode::Kind;

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiError(400, message, param);
}

// Keeps nesting within what the recognizer tracks (one frame a level, and the value's own).
constexpr int kMaxNesting = 24;

int32_t non_negative(const json& schema, const char* key, const std::string& path,
                     int32_t fallback) {
  if (!schema.contains(key)) return fallback;
  const json& v = schema[key];
  if (!v.is_number_unsigned() || v.get<uint64_t>() > 1000000)
    bad(path + "." + key, fmt::format("'{}' must be an integer from 0 to 1000000", key));
  return int32_t(v.get<uint64_t>());
}

int32_t compile(const json& schema, const std::string& path, int depth, JsonSchema& out) {
  if (!schema.is_object()) bad(path, "a schema must be a JSON object");
  if (depth > kMaxNesting)
    bad(path, fmt::format("schemas nest at most {} levels deep", kMaxNesting));
  static const std::set<std::string> annotations = {"title",   "description", "default", "examples",
                                                    "$schema", "$id",         "$comment"};
  static const std::set<std::string> keywords = {
      "type",      "properties", "required", "additionalProperties",
      "items",     "minItems",   "maxItems", "minLength",
      "maxLength", "enum",       "const"};
  for (const auto& [key, value] : schema.items())
    if (!annotations.count(key) && !keywords.count(key))
      bad(path + "." + key,
          fmt::format(
              "the schema keyword '{}' is not supported; supported: type, properties, required, "
              "additionalProperties (false), items, minItems, maxItems, minLength, maxLength, "
              "enum, const",
              key));

  if (schema.contains("enum") || schema.contains("const")) {
    JsonSchemaNode n{.kind = Kind::Literals};
    if (schema.contains("const")) n.literals.push_back(schema["const"].dump());
    if (schema.contains("enum")) {
      const json& values = schema["enum"];
      if (!values.is_array() || values.empty() || values.size() > JsonSchema::kMaxLiterals)
        bad(path + ".enum",
            fmt::format("'enum' must be a list of 1 to {} values", JsonSchema::kMaxLiterals));
      for (const json& v : values) n.literals.push_back(v.dump());
    }
    return out.add(std::move(n));
  }
  if (!schema.contains("type")) return JsonSchema::kAnyValue;
  if (!schema["type"].is_string())
    bad(path + ".type", "'type' must be one of the type names (a list of types is not supported)");
  const std::string type = schema["type"].get<std::string>();
  if (type == "string") {
    JsonSchemaNode n{.kind = Kind::String,
                     .min_length = non_negative(schema, "minLength", path, 0),
                     .max_length = non_negative(schema, "maxLength", path, -1)};
    if (n.max_length >= 0 && n.max_length < n.min_length)
      bad(path + ".maxLength", "'maxLength' is below 'minLength'");
    return out.add(std::move(n));
  }
  if (type == "number") return out.add({.kind = Kind::Number});
  if (type == "integer") return out.add({.kind = Kind::Integer});
  if (type == "boolean") return JsonSchema::kTrueFalse;
  if (type == "null") return JsonSchema::kNull;
  if (type == "array") {
    JsonSchemaNode n{.kind = Kind::Array,
                     .items = schema.contains("items")
                                  ? compile(schema["items"], path + ".items", depth + 1, out)
                                  : JsonSchema::kAnyValue,
                     .min_items = non_negative(schema, "minItems", path, 0),
                     .max_items = non_negative(schema, "maxItems", path, -1)};
    if (n.max_items >= 0 && n.max_items < n.min_items)
      bad(path + ".maxItems", "'maxItems' is below 'minItems'");
    return out.add(std::move(n));
  }
  if (type != "object")
    bad(path + ".type",
        fmt::format("'type' must be object, array, string, number, integer, boolean or null (got "
                    "'{}')",
                    type));
  JsonSchemaNode n{.kind = Kind::Object};
  if (schema.contains("additionalProperties") && schema["additionalProperties"] != false &&
      schema.contains("properties"))
    bad(path + ".additionalProperties",
        "only 'additionalProperties': false is supported beside 'properties' (replies take the "
        "listed keys)");
  if (schema.contains("properties")) {
    const json& properties = schema["properties"];
    if (!properties.is_object() || properties.size() > JsonSchema::kMaxProperties)
      bad(path + ".properties",
          fmt::format("'properties' must be an object of at most {} properties",
                      JsonSchema::kMaxProperties));
    for (const auto& [name, property] : properties.items()) {
      for (char c : name)
        if (c == '"' || c == '\\' || uint8_t(c) < 0x20)
          bad(path + ".properties", fmt::format("the property name {} has characters JSON escapes; "
                                                "use plain names",
                                                json(name).dump()));
      n.names.push_back(name);
      n.properties.push_back(compile(property, path + ".properties." + name, depth + 1, out));
    }
  }
  if (schema.contains("required")) {
    const json& required = schema["required"];
    if (!required.is_array())
      bad(path + ".required", "'required' must be a list of property names");
    for (const json& name : required) {
      const auto it = name.is_string()
                          ? std::find(n.names.begin(), n.names.end(), name.get<std::string>())
                          : n.names.end();
      if (it == n.names.end())
        bad(path + ".required",
            fmt::format("'required' names {}, which is not in 'properties'", name.dump()));
      n.required |= uint64_t(1) << (it - n.names.begin());
    }
  }
  return out.add(std::move(n));
}

}  // namespace

std::shared_ptr<const JsonSchema> parse_response_format(const json& body) {
  if (!body.contains("response_format") || body["response_format"].is_null()) return nullptr;
  const json& format = body["response_format"];
  if (!format.is_object() || !format.contains("type") || !format["type"].is_string())
    bad("response_format",
        "'response_format' must be an object with a 'type': text, json_object or json_schema");
  const std::string type = format["type"].get<std::string>();
  if (type == "text") return nullptr;
  if (type == "json_object") return std::make_shared<JsonSchema>(JsonSchema::any_object());
  if (type != "json_schema")
    bad("response_format.type",
        fmt::format("'response_format.type' must be text, json_object or json_schema "
                    "(got '{}')",
                    type));
  if (!format.contains("json_schema") || !format["json_schema"].is_object() ||
      !format["json_schema"].contains("schema"))
    bad("response_format.json_schema",
        "'response_format.json_schema' must be an object with a 'schema'");
  return compile_json_schema(format["json_schema"]["schema"], "response_format.json_schema.schema");
}

std::shared_ptr<const JsonSchema> compile_json_schema(const json& source, const std::string& path) {
  auto schema = std::make_shared<JsonSchema>();
  const int32_t root = compile(source, path, 0, *schema);
  // The root must be the last node: a builtin root (any value, boolean, null) gets a copy.
  if (root != schema->root()) schema->add(JsonSchemaNode(schema->node(root)));
  return schema;
}

}  // namespace tandem::server

#pragma once
// Constrained JSON output (`response_format` json_object / json_schema): a schema of the common
// JSON Schema subset compiled to nodes, and a recognizer that reads a reply byte by byte and says
// whether each byte can still continue a document the schema accepts. The sampler asks it about
// every candidate token, so a reply is valid JSON of the schema whatever the model's weights.
//
// Output is compact: no whitespace between tokens (a model that wants to indent is steered to the
// compact form). Objects of a schema with properties take only those keys, each at most once, in
// any order, the required ones before the closing brace; an object with no properties listed,
// and json_object mode, take any keys. The recognizer also knows the fewest bytes that complete
// the document from where it is (min_remaining), so the sampler can steer towards the end before
// max_tokens runs out: every byte JSON needs to close a document is a token of its own in the
// byte-level vocabularies.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "text/output_constraint.h"

namespace tandem {

struct JsonSchemaNode {
  enum class Kind : uint8_t { Any, Object, Array, String, Number, Integer, Literals };
  Kind kind = Kind::Any;
  // Object: the properties' names (plain text, no characters JSON escapes) and nodes; bit i of
  // `required` for names[i]. No names: any keys, values of any kind.
  std::vector<std::string> names;
  std::vector<int32_t> properties;
  uint64_t required = 0;
  // Array: the items' node and how many (max -1: any number).
  int32_t items = -1;
  int32_t min_items = 0, max_items = -1;
  // String: length bounds in characters (max -1: none).
  int32_t min_length = 0, max_length = -1;
  // Literals (enum, const, booleans, null): the accepted values as compact JSON text.
  std::vector<std::string> literals;
  int64_t min_bytes = 0;  // the shortest text of a value (compile fills it)
};

class JsonSchema {
 public:
  static constexpr size_t kMaxProperties = 64;  // per object
  static constexpr size_t kMaxLiterals = 64;    // per enum

  // Any JSON object (json_object mode).
  static JsonSchema any_object();

  // Adds a node (its children first) and returns its index; the last one added is the root.
  int32_t add(JsonSchemaNode node);
  const JsonSchemaNode& node(int32_t i) const { return nodes_[size_t(i)]; }
  int32_t root() const { return int32_t(nodes_.size()) - 1; }
  // Nodes every schema has for values of any kind, at fixed indices.
  enum Builtin : int32_t {
    kAnyValue,
    kAnyObject,
    kAnyArray,
    kAnyString,
    kNumber,
    kTrueFalse,
    kNull
  };

  JsonSchema();

 private:
  std::vector<JsonSchemaNode> nodes_;
};

class JsonRecognizer : public OutputConstraint {
 public:
  explicit JsonRecognizer(const JsonSchema& schema);
  // A document of the schema's node `node` (a property's value) instead of its root.
  JsonRecognizer(const JsonSchema& schema, int32_t node);
  JsonRecognizer(const JsonRecognizer& other) : OutputConstraint() { *this = other; }
  JsonRecognizer& operator=(const JsonRecognizer& other);  // copies the active frames only

  // Reads bytes; false when one cannot continue a document of the schema (the recognizer is
  // then in no defined state: try on a copy).
  bool feed(char c);
  bool feed(std::string_view bytes) override;
  // A whole document has been read (nothing may follow it).
  bool complete() const override;
  // The fewest bytes that make the document complete from here.
  int64_t min_remaining() const override;

  std::unique_ptr<OutputConstraint> clone() const override {
    return std::make_unique<JsonRecognizer>(*this);
  }
  void copy_from(const OutputConstraint& other) override {
    *this = static_cast<const JsonRecognizer&>(other);
  }

 private:
  enum class Type : uint8_t { Value, Object, Array, String, Literal, Number };
  struct Frame {
    int32_t node = 0;
    Type type = Type::Value;
    uint8_t phase = 0;
    uint8_t pending = 0;      // string: UTF-8 continuation bytes or \u hex digits still to come
    uint8_t next_lo = 0x80, next_hi = 0xBF;  // string: the next continuation byte's range
    int32_t count = 0;        // string: characters; array: items; key and literal: position
    int32_t current = -1;     // object: the property being read (-1: a key of any text)
    uint64_t used = 0;        // object: properties written
    uint64_t candidates = 0;  // object key, literal: what the bytes so far can still be
  };
  static constexpr size_t kMaxDepth = 32;

  bool step(char c);
  void finish_value();                 // pops the top frame, a value read whole
  bool may_end(const Frame& f) const;  // the frame could end here (a number, a literal)
  // The bytes frame `f` needs to end once the frame above it (if any) has ended.
  int64_t remaining_of(const Frame& f) const;
  int64_t object_rest(const JsonSchemaNode& n, uint64_t used) const;

  const JsonSchema* schema_;
  std::array<Frame, kMaxDepth> stack_;
  size_t depth_ = 0;
  bool done_ = false;
};

}  // namespace tandem

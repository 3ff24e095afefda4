#include "text/json_constraint.h"

#include <algorithm>
#include <bit>
#include <limits>

#include "core/error.h"
#include "text/literal_match.h"

namespace tandem {
namespace {

using Kind = JsonSchemaNode::Kind;
using literal::all_of;
using literal::continuing;

// Object phases.
enum : uint8_t {
  kKeyOrEnd,     // after '{': a key or '}'
  kNextKey,      // after ',': a key
  kKey,          // inside a listed property's name
  kAnyKey,       // inside a key of any text (a string frame above)
  kColon,        // after a key
  kMemberValue,  // a value frame above
  kCommaOrEnd,   // after a value
};
// Array phases.
enum : uint8_t { kFirstItem, kItem, kItemCommaOrEnd };
// String phases.
enum : uint8_t { kChars, kEscape, kUnicode };
// Number phases: after the start, '-', a leading 0, integer digits, '.', fraction digits, 'e',
// the exponent's sign, exponent digits.
enum : uint8_t { kStart, kMinus, kZero, kInt, kDot, kFrac, kExp, kExpSign, kExpDigits };

// Bounds on a number's digits: 18 keep an integer within int64, and an exponent of two digits keeps
// every number a finite double (a reader parsing 1e999 gets infinity or an error).
constexpr int32_t kMaxNumberDigits = 18;
constexpr int32_t kMaxExponentDigits = 2;

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_hex(char c) {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

int64_t sum_required(const JsonSchemaNode& n, uint64_t mask, const JsonSchema& schema) {
  int64_t total = 0;
  for (size_t i = 0; i < n.names.size(); ++i)
    if (mask >> i & 1)
      total += int64_t(n.names[i].size()) + 3 + schema.node(n.properties[i]).min_bytes;
  return total;
}

}  // namespace

JsonSchema::JsonSchema() {
  add({.kind = Kind::Any});                                      // kAnyValue
  add({.kind = Kind::Object});                                   // kAnyObject
  add({.kind = Kind::Array, .items = kAnyValue});                // kAnyArray
  add({.kind = Kind::String});                                   // kAnyString
  add({.kind = Kind::Number});                                   // kNumber
  add({.kind = Kind::Literals, .literals = {"true", "false"}});  // kTrueFalse
  add({.kind = Kind::Literals, .literals = {"null"}});           // kNull
}

JsonSchema JsonSchema::any_object() {
  JsonSchema schema;
  schema.add({.kind = Kind::Object});
  return schema;
}

int32_t JsonSchema::add(JsonSchemaNode n) {
  switch (n.kind) {
    case Kind::Any:
    case Kind::Number:
    case Kind::Integer:
      n.min_bytes = 1;
      break;
    case Kind::Object: {
      TANDEM_CHECK(n.names.size() == n.properties.size() && n.names.size() <= kMaxProperties);
      const int64_t required = std::popcount(n.required);
      n.min_bytes = 2 + sum_required(n, n.required, *this) + std::max<int64_t>(0, required - 1);
      break;
    }
    case Kind::Array:
      n.min_bytes =
          2 + int64_t(n.min_items) * node(n.items).min_bytes + std::max(0, n.min_items - 1);
      break;
    case Kind::String:
      n.min_bytes = 2 + n.min_length;
      break;
    case Kind::Literals:
      TANDEM_CHECK(!n.literals.empty() && n.literals.size() <= kMaxLiterals);
      n.min_bytes = int64_t(
          std::min_element(n.literals.begin(), n.literals.end(), [](const auto& a, const auto& b) {
            return a.size() < b.size();
          })->size());
      break;
  }
  nodes_.push_back(std::move(n));
  return int32_t(nodes_.size()) - 1;
}

JsonRecognizer::JsonRecognizer(const JsonSchema& schema) : JsonRecognizer(schema, schema.root()) {}

JsonRecognizer::JsonRecognizer(const JsonSchema& schema, int32_t node) : schema_(&schema) {
  stack_[0] = {.node = node, .type = Type::Value};
  depth_ = 1;
}

JsonRecognizer& JsonRecognizer::operator=(const JsonRecognizer& other) {
  schema_ = other.schema_;
  depth_ = other.depth_;
  done_ = other.done_;
  std::copy(other.stack_.begin(), other.stack_.begin() + std::ptrdiff_t(depth_), stack_.begin());
  return *this;
}

bool JsonRecognizer::feed(std::string_view bytes) {
  for (char c : bytes)
    if (!feed(c)) return false;
  return true;
}

bool JsonRecognizer::feed(char c) {
  // A byte that ends a number or a literal (a ',' after "12") is read again by the frame below.
  for (;;) {
    if (done_ || depth_ == 0) return false;
    const size_t depth = depth_;
    Frame& f = stack_[depth_ - 1];
    const bool ends_here = (f.type == Type::Number || f.type == Type::Literal) && may_end(f);
    if (step(c)) return true;
    if (!ends_here || depth_ != depth) return false;
    finish_value();
  }
}

bool JsonRecognizer::may_end(const Frame& f) const {
  if (f.type == Type::Number)
    return f.phase == kZero || f.phase == kInt || f.phase == kFrac || f.phase == kExpDigits;
  if (f.type == Type::Literal) {
    const auto& literals = schema_->node(f.node).literals;
    for (size_t i = 0; i < literals.size(); ++i)
      if ((f.candidates >> i & 1) && int32_t(literals[i].size()) == f.count) return true;
  }
  return false;
}

bool JsonRecognizer::complete() const {
  return done_ || (depth_ == 1 && may_end(stack_[0]));
}

void JsonRecognizer::finish_value() {
  --depth_;
  if (depth_ == 0) {
    done_ = true;
    return;
  }
  Frame& parent = stack_[depth_ - 1];
  if (parent.type == Type::Object)
    parent.phase = parent.phase == kAnyKey ? kColon : kCommaOrEnd;
  else if (parent.type == Type::Array)
    parent.phase = kItemCommaOrEnd;
}

// One byte for the top frame; false if it cannot take it (a number or literal that may end
// there leaves it to the caller).
bool JsonRecognizer::step(char c) {
  Frame& f = stack_[depth_ - 1];
  const JsonSchemaNode& n = schema_->node(f.node);
  auto push = [&](int32_t node) {
    if (depth_ == kMaxDepth) return false;
    stack_[depth_++] = {.node = node, .type = Type::Value};
    return true;
  };
  switch (f.type) {
    case Type::Value:
      switch (n.kind) {
        case Kind::Any:
          // The value's kind is its first byte's.
          f.node = c == '{'                  ? JsonSchema::kAnyObject
                   : c == '['                ? JsonSchema::kAnyArray
                   : c == '"'                ? JsonSchema::kAnyString
                   : c == 't' || c == 'f'    ? JsonSchema::kTrueFalse
                   : c == 'n'                ? JsonSchema::kNull
                   : c == '-' || is_digit(c) ? JsonSchema::kNumber
                                             : -1;
          if (f.node < 0) return false;
          return step(c);
        case Kind::Object:
          if (c != '{') return false;
          f = {.node = f.node, .type = Type::Object, .phase = kKeyOrEnd};
          return true;
        case Kind::Array:
          if (c != '[') return false;
          f = {.node = f.node, .type = Type::Array, .phase = kFirstItem};
          return true;
        case Kind::String:
          if (c != '"') return false;
          f = {.node = f.node, .type = Type::String, .phase = kChars};
          return true;
        case Kind::Number:
        case Kind::Integer:
          f = {.node = f.node, .type = Type::Number, .phase = kStart};
          return step(c);
        case Kind::Literals:
          f = {.node = f.node, .type = Type::Literal, .candidates = all_of(n.literals.size())};
          return step(c);
      }
      return false;

    case Type::Object: {
      const uint64_t listed = all_of(n.names.size());
      const bool any_keys = n.names.empty();
      const bool required_done = (n.required & ~f.used) == 0;
      auto start_key = [&] {
        if (any_keys) {
          f.phase = kAnyKey;
          f.current = -1;
          if (!push(JsonSchema::kAnyString)) return false;
          stack_[depth_ - 1] = {
              .node = JsonSchema::kAnyString, .type = Type::String, .phase = kChars};
          return true;
        }
        f.candidates = listed & ~f.used;
        if (!f.candidates) return false;
        f.phase = kKey;
        f.count = 0;
        return true;
      };
      switch (f.phase) {
        case kKeyOrEnd:
          if (c == '}' && required_done) return finish_value(), true;
          return c == '"' && start_key();
        case kNextKey:
          return c == '"' && start_key();
        case kKey: {
          if (c == '"') {
            for (size_t i = 0; i < n.names.size(); ++i)
              if ((f.candidates >> i & 1) && int32_t(n.names[i].size()) == f.count) {
                f.current = int32_t(i);
                f.used |= uint64_t(1) << i;
                f.phase = kColon;
                return true;
              }
            return false;
          }
          const uint64_t next = continuing(n.names, f.candidates, f.count, c);
          if (!next) return false;
          f.candidates = next;
          ++f.count;
          return true;
        }
        case kColon: {
          if (c != ':') return false;
          f.phase = kMemberValue;
          return push(f.current < 0 ? JsonSchema::kAnyValue : n.properties[size_t(f.current)]);
        }
        case kCommaOrEnd:
          if (c == '}' && required_done) return finish_value(), true;
          if (c == ',' && (any_keys || (listed & ~f.used))) return f.phase = kNextKey, true;
          return false;
        default:
          return false;  // a frame above reads the bytes
      }
    }

    case Type::Array:
      switch (f.phase) {
        case kFirstItem:
          if (c == ']') return n.min_items == 0 && (finish_value(), true);
          if (n.max_items == 0) return false;
          f.count = 1;
          f.phase = kItem;
          if (!push(n.items)) return false;
          return step(c);
        case kItemCommaOrEnd:
          if (c == ']') return f.count >= n.min_items && (finish_value(), true);
          if (c != ',' || (n.max_items >= 0 && f.count >= n.max_items)) return false;
          ++f.count;
          f.phase = kItem;
          return push(n.items);
        default:
          return false;
      }

    case Type::String: {
      const auto byte = uint8_t(c);
      const bool room = n.max_length < 0 || f.count < n.max_length;
      if (f.phase == kEscape) {
        if (c == 'u') return f.phase = kUnicode, f.pending = 4, true;
        if (std::string_view("\"\\/bfnrt").find(c) == std::string_view::npos) return false;
        f.phase = kChars;
        return true;
      }
      if (f.phase == kUnicode) {
        if (!is_hex(c)) return false;
        if (--f.pending == 0) f.phase = kChars;
        return true;
      }
      if (f.pending > 0) {  // inside a UTF-8 character
        if (byte < f.next_lo || byte > f.next_hi) return false;
        --f.pending;
        f.next_lo = 0x80, f.next_hi = 0xBF;
        return true;
      }
      if (c == '"') return f.count >= n.min_length && (finish_value(), true);
      if (byte < 0x20 || !room) return false;
      ++f.count;
      if (c == '\\') return f.phase = kEscape, true;
      if (byte < 0x80) return true;
      f.pending = byte >= 0xC2 && byte <= 0xDF   ? 1
                  : byte >= 0xE0 && byte <= 0xEF ? 2
                  : byte >= 0xF0 && byte <= 0xF4 ? 3
                                                 : 0;
      // The second byte's range excludes overlong forms, surrogates and code points past U+10FFFF.
      f.next_lo = byte == 0xE0 ? 0xA0 : byte == 0xF0 ? 0x90 : 0x80;
      f.next_hi = byte == 0xED ? 0x9F : byte == 0xF4 ? 0x8F : 0xBF;
      return f.pending > 0;
    }

    case Type::Literal: {
      const uint64_t next = continuing(n.literals, f.candidates, f.count, c);
      if (!next) return false;
      f.candidates = next;
      ++f.count;
      // A literal no other candidate continues ends here (the next byte belongs to the parent).
      for (size_t i = 0; i < n.literals.size(); ++i)
        if ((next >> i & 1) && int32_t(n.literals[i].size()) > f.count) return true;
      finish_value();
      return true;
    }

    case Type::Number: {
      const bool integer = n.kind == Kind::Integer;
      const bool digit = is_digit(c);
      const bool exponent = f.phase == kExp || f.phase == kExpSign || f.phase == kExpDigits;
      if (digit && exponent && f.phase == kExpDigits && f.pending >= kMaxExponentDigits)
        return false;
      if (digit && exponent) ++f.pending;  // exponent digits
      if (digit && !exponent && ++f.count > kMaxNumberDigits) return false;
      switch (f.phase) {
        case kStart:
          if (c == '-') return f.phase = kMinus, true;
          [[fallthrough]];
        case kMinus:
          if (!digit) return false;
          f.phase = c == '0' ? kZero : kInt;
          return true;
        case kZero:
        case kInt:
          if (digit) return f.phase == kInt;
          if (integer) return false;
          if (c == '.') return f.phase = kDot, true;
          if (c == 'e' || c == 'E') return f.phase = kExp, true;
          return false;
        case kDot:
          return digit && (f.phase = kFrac, true);
        case kFrac:
          if (digit) return true;
          return (c == 'e' || c == 'E') && (f.phase = kExp, true);
        case kExp:
          if (c == '+' || c == '-') return f.phase = kExpSign, true;
          [[fallthrough]];
        case kExpSign:
          return digit && (f.phase = kExpDigits, true);
        case kExpDigits:
          return digit;
        default:
          return false;
      }
    }
  }
  return false;
}

int64_t JsonRecognizer::object_rest(const JsonSchemaNode& n, uint64_t used) const {
  // The '}' and, for each required property not written yet, ',"name":' and its shortest value.
  const uint64_t missing = n.required & ~used;
  return 1 + sum_required(n, missing, *schema_) + std::popcount(missing);
}

int64_t JsonRecognizer::remaining_of(const Frame& f) const {
  const JsonSchemaNode& n = schema_->node(f.node);
  switch (f.type) {
    case Type::Value:
      return n.min_bytes;
    case Type::Object: {
      const uint64_t missing = n.required & ~f.used;
      auto min_member = [&](uint64_t mask) {  // '"name":' and a value, the shortest allowed
        if (n.names.empty()) return int64_t(4);
        int64_t best = std::numeric_limits<int64_t>::max();
        for (size_t i = 0; i < n.names.size(); ++i)
          if (mask >> i & 1)
            best = std::min(
                best, int64_t(n.names[i].size()) + 3 + schema_->node(n.properties[i]).min_bytes);
        return best;
      };
      switch (f.phase) {
        case kKeyOrEnd:
          return missing ? object_rest(n, f.used) - 1 : 1;
        case kNextKey:
          return missing ? object_rest(n, f.used) - 1
                         : min_member(all_of(n.names.size()) & ~f.used) + 1;
        case kKey: {
          int64_t best = std::numeric_limits<int64_t>::max();
          for (size_t i = 0; i < n.names.size(); ++i)
            if (f.candidates >> i & 1) {
              const uint64_t bit = uint64_t(1) << i;
              best = std::min(best, int64_t(n.names[i].size()) - f.count + 2 +
                                        schema_->node(n.properties[i]).min_bytes +
                                        object_rest(n, f.used | bit));
            }
          return best;
        }
        case kAnyKey:
          return 3;  // ':', a one-byte value, '}'
        case kColon:
          return 1 +
                 (f.current < 0 ? 1 : schema_->node(n.properties[size_t(f.current)]).min_bytes) +
                 object_rest(n, f.used);
        default:  // kMemberValue, kCommaOrEnd
          return object_rest(n, f.used);
      }
    }
    case Type::Array: {
      const int64_t item = schema_->node(n.items).min_bytes;
      if (f.phase == kFirstItem)
        return n.min_items == 0 ? 1 : n.min_items * item + (n.min_items - 1) + 1;
      return std::max(0, n.min_items - f.count) * (1 + item) + 1;
    }
    case Type::String: {
      // An escape's byte, \u's hex digits or a UTF-8 character's continuation bytes.
      const int64_t inside = f.phase == kEscape ? 1 : f.pending;
      return inside + std::max(0, n.min_length - f.count) + 1;
    }
    case Type::Literal: {
      int64_t best = std::numeric_limits<int64_t>::max();
      for (size_t i = 0; i < n.literals.size(); ++i)
        if (f.candidates >> i & 1) best = std::min(best, int64_t(n.literals[i].size()) - f.count);
      return best;
    }
    case Type::Number:
      return may_end(f) ? 0 : 1;
  }
  return 0;
}

int64_t JsonRecognizer::min_remaining() const {
  if (done_) return 0;
  int64_t total = 0;
  for (size_t i = 0; i < depth_; ++i) total += remaining_of(stack_[i]);
  return total;
}

}  // namespace tandem

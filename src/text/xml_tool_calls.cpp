#include "text/xml_tool_calls.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "core/error.h"
#include "text/chat_template_internal.h"
#include "text/json_constraint.h"
#include "text/literal_match.h"

namespace tandem {
namespace {

using Kind = JsonSchemaNode::Kind;
using literal::all_of;
using literal::consume;
using literal::continuing;
using literal::finished;

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";
constexpr std::string_view kKeyOpen = "<arg_key>";
constexpr std::string_view kKeyToValue = "</arg_key>\n<arg_value>";
constexpr std::string_view kValueClose = "</arg_value>\n";

// Whether a property's value is written raw: a string, or an enum of strings only.
bool raw_value(const JsonSchemaNode& n) {
  if (n.kind == Kind::String) return true;
  return n.kind == Kind::Literals && !n.literals.empty() &&
         std::all_of(n.literals.begin(), n.literals.end(),
                     [](const std::string& l) { return l.starts_with('"'); });
}

// An enum's string as its raw value: the text its JSON literal stands for.
std::string raw_text(const std::string& json_literal) {
  return nlohmann::json::parse(json_literal).get<std::string>();
}

// The node of `tool`'s parameter `key`, or nullopt when the tool lists no such parameter.
std::optional<int32_t> parameter_node(const ToolSpec& tool, std::string_view key) {
  const JsonSchemaNode& root = tool.parameters->node(tool.parameters->root());
  for (size_t i = 0; i < root.names.size(); ++i)
    if (root.names[i] == key) return root.properties[i];
  return std::nullopt;
}

// One call's arguments as JSON, each value typed by the tool's parameters where it has them.
std::optional<nlohmann::ordered_json> parse_arguments(std::string_view& s, const ToolSpec* tool) {
  nlohmann::ordered_json args = nlohmann::ordered_json::object();
  while (!consume(s, kClose)) {
    if (!consume(s, kKeyOpen)) return std::nullopt;
    const size_t key_end = s.find(kKeyToValue);
    if (key_end == std::string_view::npos || key_end == 0) return std::nullopt;
    const std::string key(s.substr(0, key_end));
    s.remove_prefix(key_end + kKeyToValue.size());
    const size_t value_end = s.find("</arg_value>");
    if (value_end == std::string_view::npos || args.contains(key)) return std::nullopt;
    const std::string_view value = s.substr(0, value_end);
    s.remove_prefix(value_end + std::string_view("</arg_value>").size());
    consume(s, "\n");
    const std::optional<int32_t> node = tool ? parameter_node(*tool, key) : std::nullopt;
    if (node && raw_value(tool->parameters->node(*node))) {
      args[key] = std::string(value);
      continue;
    }
    auto parsed = nlohmann::ordered_json::parse(value, nullptr, /*allow_exceptions=*/false);
    args[key] = parsed.is_discarded() ? nlohmann::ordered_json(std::string(value)) : parsed;
  }
  return args;
}

// One tool's parameters as the grammar needs them.
struct Tool {
  const JsonSchema* schema = nullptr;
  bool any_keys = false;            // parameters without listed properties: keys of any text
  std::vector<std::string> keys;    // each property's name and kKeyToValue
  std::vector<int32_t> nodes;       // each property's value node
  std::vector<int64_t> pair_bytes;  // the fewest bytes of each property's whole pair
  uint64_t required = 0;
};

int64_t value_min_bytes(const JsonSchemaNode& n) {
  if (n.kind == Kind::String) return n.min_length;
  if (raw_value(n)) {  // an enum of strings: the shortest raw
    int64_t best = std::numeric_limits<int64_t>::max();
    for (const std::string& l : n.literals) best = std::min<int64_t>(best, raw_text(l).size());
    return best;
  }
  return n.min_bytes;
}

class XmlToolCall : public OutputConstraint {
 public:
  explicit XmlToolCall(std::shared_ptr<const std::vector<ToolSpec>> specs)
      : specs_(std::move(specs)) {
    for (const ToolSpec& spec : *specs_) {
      Tool t{.schema = spec.parameters.get()};
      const JsonSchemaNode& root = t.schema->node(t.schema->root());
      t.any_keys = root.names.empty();
      t.required = root.required;
      for (size_t i = 0; i < root.names.size(); ++i) {
        t.keys.push_back(root.names[i] + std::string(kKeyToValue));
        t.nodes.push_back(root.properties[i]);
        t.pair_bytes.push_back(
            int64_t(kKeyOpen.size() + t.keys.back().size() + kValueClose.size()) +
            value_min_bytes(t.schema->node(root.properties[i])));
      }
      heads_.push_back(spec.name + "\n");
      tools_.push_back(std::move(t));
    }
    alive_ = all_of(heads_.size());
  }
  XmlToolCall(const XmlToolCall& o)
      : OutputConstraint(), specs_(o.specs_), tools_(o.tools_), heads_(o.heads_) {
    copy_from(o);
  }
  std::unique_ptr<OutputConstraint> clone() const override {
    return std::make_unique<XmlToolCall>(*this);
  }
  void copy_from(const OutputConstraint& other) override {
    const auto& o = static_cast<const XmlToolCall&>(other);
    phase_ = o.phase_, pos_ = o.pos_, alive_ = o.alive_, tool_ = o.tool_, used_ = o.used_;
    current_ = o.current_, count_ = o.count_, pending_ = o.pending_, free_keys_ = o.free_keys_;
    key_text_ = o.key_text_, literals_ = o.literals_;
    if (!o.json_)
      json_.reset();
    else if (json_)
      *json_ = *o.json_;
    else
      json_ = std::make_unique<JsonRecognizer>(*o.json_);
  }

  bool feed(std::string_view bytes) override {
    for (char c : bytes)
      if (!step(c)) return false;
    return true;
  }
  bool complete() const override { return phase_ == Phase::Done; }
  // A marker's text may come between the parts (where it must match the tag that comes next),
  // not inside a raw value or key, where it would be taken as text.
  bool takes_control_tokens() const override {
    if (phase_ == Phase::JsonValue) return json_->complete();
    return phase_ != Phase::RawValue && phase_ != Phase::FreeKey;
  }

  int64_t min_remaining() const override {
    const int64_t close = int64_t(kClose.size());
    switch (phase_) {
      case Phase::Opening: {
        int64_t best = std::numeric_limits<int64_t>::max();
        for (size_t i = 0; i < tools_.size(); ++i)
          best = std::min(best, int64_t(heads_[i].size()) + required_rest(tools_[i], 0));
        return int64_t(kOpen.size()) - pos_ + best + close;
      }
      case Phase::Head: {
        int64_t best = std::numeric_limits<int64_t>::max();
        for (size_t i = 0; i < tools_.size(); ++i)
          if (alive_ >> i & 1)
            best = std::min(best, int64_t(heads_[i].size()) - pos_ + required_rest(tools_[i], 0));
        return best + close;
      }
      case Phase::Next: {
        const Tool& t = tool();
        const int64_t rest = required_rest(t, used_);
        int64_t best = std::numeric_limits<int64_t>::max();
        if (alive_ & kCloseBit) best = close - pos_;
        if (alive_ & kKeyBit) {
          int64_t pair = std::numeric_limits<int64_t>::max();
          if (t.any_keys)
            pair = int64_t(kKeyOpen.size() + kKeyToValue.size() + kValueClose.size()) + 2;
          for (size_t k = 0; k < t.keys.size(); ++k)
            if (!(used_ >> k & 1))
              pair =
                  std::min(pair, t.pair_bytes[k] - ((t.required >> k & 1) ? t.pair_bytes[k] : 0));
          best = std::min(best, pair + rest - pos_ + close);
        }
        return best;
      }
      case Phase::Key: {
        const Tool& t = tool();
        const int64_t rest = required_rest(t, used_);
        int64_t best = std::numeric_limits<int64_t>::max();
        for (size_t k = 0; k < t.keys.size(); ++k)
          if (alive_ >> k & 1)
            best = std::min(best, int64_t(t.keys[k].size()) - pos_ +
                                      value_min_bytes(t.schema->node(t.nodes[k])) +
                                      int64_t(kValueClose.size()) -
                                      ((t.required >> k & 1) ? t.pair_bytes[k] : 0));
        return best + rest + close;
      }
      case Phase::FreeKey: {
        // A key that repeats one already written needs another character first.
        const bool repeats = count_ > 0 && std::find(free_keys_.begin(), free_keys_.end(),
                                                     key_text_) != free_keys_.end();
        return (count_ == 0 || repeats ? 1 : 0) + int64_t(kKeyToValue.size()) + 1 + after_value();
      }
      case Phase::FreeKeyEnd:
        return int64_t(kKeyToValue.size()) - pos_ + 1 + after_value();
      case Phase::RawValue: {
        const JsonSchemaNode& n = tool().schema->node(tool().nodes[size_t(current_)]);
        return std::max<int64_t>(0, n.min_length - count_) + pending_ + after_value();
      }
      case Phase::EnumValue: {
        int64_t best = std::numeric_limits<int64_t>::max();
        for (size_t i = 0; i < literals_.size(); ++i)
          if (alive_ >> i & 1) best = std::min(best, int64_t(literals_[i].size()) - pos_);
        return best - int64_t(kValueClose.size()) + after_value();
      }
      case Phase::JsonValue:
        return json_->min_remaining() + after_value();
      case Phase::ValueClose:
        return int64_t(kValueClose.size()) - pos_ + required_rest(tool(), used_) + close;
      case Phase::Done:
        return 0;
    }
    return 0;
  }

 private:
  enum class Phase {
    Opening,     // "<tool_call>"
    Head,        // a tool's name and newline
    Next,        // "<arg_key>" or "</tool_call>"
    Key,         // a listed property's name and kKeyToValue
    FreeKey,     // a key of any text (no '<', no newline)
    FreeKeyEnd,  // kKeyToValue after it
    RawValue,    // a string's raw text
    EnumValue,   // one of the enum's strings and kValueClose
    JsonValue,   // compact JSON of the property's schema
    ValueClose,  // kValueClose
    Done,
  };
  static constexpr uint64_t kKeyBit = 1, kCloseBit = 2;

  const Tool& tool() const { return tools_[size_t(tool_)]; }

  // The fewest bytes of the required pairs not written yet.
  static int64_t required_rest(const Tool& t, uint64_t used) {
    int64_t total = 0;
    for (size_t k = 0; k < t.keys.size(); ++k)
      if ((t.required >> k & 1) && !(used >> k & 1)) total += t.pair_bytes[k];
    return total;
  }
  // After the value being read: its closing, the required pairs left, the call's closing.
  int64_t after_value() const {
    return int64_t(kValueClose.size()) + required_rest(tool(), used_) + int64_t(kClose.size());
  }

  void start_next() {
    phase_ = Phase::Next, pos_ = 0, alive_ = 0;
    const Tool& t = tool();
    if (t.any_keys || (used_ != all_of(t.keys.size()))) alive_ |= kKeyBit;
    if ((t.required & ~used_) == 0) alive_ |= kCloseBit;
  }

  void start_value(int32_t node) {
    const JsonSchemaNode& n = tool().schema->node(node);
    pos_ = 0, count_ = 0, pending_ = 0;
    if (n.kind == Kind::String) {
      phase_ = Phase::RawValue;
    } else if (raw_value(n)) {
      phase_ = Phase::EnumValue;
      literals_.clear();
      for (const std::string& l : n.literals)
        literals_.push_back(raw_text(l) + std::string(kValueClose));
      alive_ = all_of(literals_.size());
    } else {
      phase_ = Phase::JsonValue;
      json_ = std::make_unique<JsonRecognizer>(*tool().schema, node);
    }
  }

  bool step(char c) {
    switch (phase_) {
      case Phase::Opening:
        if (kOpen[size_t(pos_)] != c) return false;
        if (++pos_ == int32_t(kOpen.size())) phase_ = Phase::Head, pos_ = 0;
        return true;
      case Phase::Head: {
        const uint64_t next = continuing(heads_, alive_, pos_, c);
        if (!next) return false;
        alive_ = next, ++pos_;
        if (const int32_t i = finished(heads_, alive_, pos_); i >= 0) {
          tool_ = i, used_ = 0, free_keys_.clear();
          start_next();
        }
        return true;
      }
      case Phase::Next: {
        uint64_t next = 0;
        if ((alive_ & kKeyBit) && kKeyOpen[size_t(pos_)] == c) next |= kKeyBit;
        if ((alive_ & kCloseBit) && kClose[size_t(pos_)] == c) next |= kCloseBit;
        if (!next) return false;
        alive_ = next, ++pos_;
        if ((alive_ & kCloseBit) && pos_ == int32_t(kClose.size())) {
          phase_ = Phase::Done;
        } else if ((alive_ & kKeyBit) && pos_ == int32_t(kKeyOpen.size())) {
          pos_ = 0, count_ = 0;
          if (tool().any_keys) {
            phase_ = Phase::FreeKey, key_text_.clear();
          } else {
            phase_ = Phase::Key, alive_ = all_of(tool().keys.size()) & ~used_;
          }
        }
        return true;
      }
      case Phase::Key: {
        const uint64_t next = continuing(tool().keys, alive_, pos_, c);
        if (!next) return false;
        alive_ = next, ++pos_;
        if (const int32_t k = finished(tool().keys, alive_, pos_); k >= 0) {
          used_ |= uint64_t(1) << k, current_ = k;
          start_value(tool().nodes[size_t(k)]);
        }
        return true;
      }
      case Phase::FreeKey:
        if (c == '<' && count_ > 0) {
          if (std::find(free_keys_.begin(), free_keys_.end(), key_text_) != free_keys_.end())
            return false;  // each key once
          free_keys_.push_back(key_text_);
          phase_ = Phase::FreeKeyEnd, pos_ = 1;
          return true;
        }
        if (c == '<' || c == '\n' || c == '\0') return false;
        key_text_ += c, ++count_;
        return true;
      case Phase::FreeKeyEnd:
        if (kKeyToValue[size_t(pos_)] != c) return false;
        if (++pos_ == int32_t(kKeyToValue.size())) {
          phase_ = Phase::JsonValue;
          json_ = std::make_unique<JsonRecognizer>(*tool().schema, JsonSchema::kAnyValue);
        }
        return true;
      case Phase::RawValue: {
        const JsonSchemaNode& n = tool().schema->node(tool().nodes[size_t(current_)]);
        const auto b = uint8_t(c);
        if (pending_ > 0) {  // a character's continuation bytes
          if ((b & 0xC0) != 0x80) return false;
          --pending_;
          return true;
        }
        if (c == '<') {
          if (count_ < n.min_length) return false;
          phase_ = Phase::ValueClose, pos_ = 1;
          return true;
        }
        if (c == '\0' || (n.max_length >= 0 && count_ >= n.max_length)) return false;
        if (b >= 0x80) {  // a character's lead byte
          if (b >= 0xC2 && b <= 0xDF)
            pending_ = 1;
          else if (b >= 0xE0 && b <= 0xEF)
            pending_ = 2;
          else if (b >= 0xF0 && b <= 0xF4)
            pending_ = 3;
          else
            return false;
        }
        ++count_;
        return true;
      }
      case Phase::EnumValue: {
        const uint64_t next = continuing(literals_, alive_, pos_, c);
        if (!next) return false;
        alive_ = next, ++pos_;
        if (finished(literals_, alive_, pos_) >= 0) start_next();
        return true;
      }
      case Phase::JsonValue:
        // The closing tag ends the value where it may end (a number has no closing mark).
        if (c == kValueClose[0] && json_->complete()) {
          phase_ = Phase::ValueClose, pos_ = 1;
          return true;
        }
        return json_->feed(c);
      case Phase::ValueClose:
        if (kValueClose[size_t(pos_)] != c) return false;
        if (++pos_ == int32_t(kValueClose.size())) start_next();
        return true;
      case Phase::Done:
        return false;
    }
    return false;
  }

  std::shared_ptr<const std::vector<ToolSpec>> specs_;
  std::vector<Tool> tools_;
  std::vector<std::string> heads_;  // each tool's name and newline
  Phase phase_ = Phase::Opening;
  int32_t pos_ = 0;
  uint64_t alive_ =
      0;  // Head: tools; Next: kKeyBit/kCloseBit; Key: properties; EnumValue: literals
  int32_t tool_ = -1;
  uint64_t used_ = 0;  // properties written
  int32_t current_ = -1;
  int32_t count_ = 0;    // characters of a raw value or a free key
  int32_t pending_ = 0;  // continuation bytes a raw value's character still needs
  std::string key_text_;
  std::vector<std::string> free_keys_;
  std::vector<std::string> literals_;  // EnumValue: each string and kValueClose
  std::unique_ptr<JsonRecognizer> json_;
};

}  // namespace

ToolReply parse_xml_tool_calls(std::string_view text, std::span<const ToolSpec> tools) {
  const size_t begin = text.find(kOpen);
  if (begin == std::string_view::npos) return {std::string(text), {}};
  ToolReply reply{.content = std::string(chat::rstrip(text.substr(0, begin), "\n")), .calls = {}};
  std::string_view rest = text.substr(begin);
  while (!rest.empty()) {
    if (!consume(rest, kOpen)) return {std::string(text), {}};
    const size_t name_end = rest.find('\n');
    if (name_end == std::string_view::npos || name_end == 0) return {std::string(text), {}};
    const std::string name(rest.substr(0, name_end));
    rest.remove_prefix(name_end + 1);
    const auto tool =
        std::find_if(tools.begin(), tools.end(), [&](const ToolSpec& t) { return t.name == name; });
    const std::optional<nlohmann::ordered_json> args =
        parse_arguments(rest, tool == tools.end() ? nullptr : &*tool);
    if (!args) return {std::string(text), {}};
    reply.calls.push_back({.id = {},
                           .name = name,
                           .arguments = args->dump(
                               -1, ' ', false, nlohmann::ordered_json::error_handler_t::replace)});
    rest = chat::lstrip(rest, "\n");
  }
  return reply;
}

std::unique_ptr<OutputConstraint> one_xml_tool_call(
    std::shared_ptr<const std::vector<ToolSpec>> tools) {
  TANDEM_CHECK(!tools->empty() && tools->size() <= 64);
  return std::make_unique<XmlToolCall>(std::move(tools));
}

}  // namespace tandem

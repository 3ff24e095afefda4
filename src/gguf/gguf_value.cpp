#include "gguf/gguf_value.h"

#include <fmt/format.h>

#include <limits>
#include <type_traits>

#include "core/error.h"

namespace tandem::gguf {

std::string_view value_type_name(ValueType type) {
  switch (type) {
    case ValueType::U8:
      return "u8";
    case ValueType::I8:
      return "i8";
    case ValueType::U16:
      return "u16";
    case ValueType::I16:
      return "i16";
    case ValueType::U32:
      return "u32";
    case ValueType::I32:
      return "i32";
    case ValueType::F32:
      return "f32";
    case ValueType::Bool:
      return "bool";
    case ValueType::String:
      return "string";
    case ValueType::Array:
      return "array";
    case ValueType::U64:
      return "u64";
    case ValueType::I64:
      return "i64";
    case ValueType::F64:
      return "f64";
  }
  return "unknown";
}

uint64_t value_type_fixed_size(ValueType type) {
  switch (type) {
    case ValueType::U8:
    case ValueType::I8:
    case ValueType::Bool:
      return 1;
    case ValueType::U16:
    case ValueType::I16:
      return 2;
    case ValueType::U32:
    case ValueType::I32:
    case ValueType::F32:
      return 4;
    case ValueType::U64:
    case ValueType::I64:
    case ValueType::F64:
      return 8;
    case ValueType::String:
    case ValueType::Array:
      return 0;
  }
  return 0;
}

Value Value::array(ValueType elem_type, std::vector<Value> items) {
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].type() != elem_type)
      fail("array item {} has type {}, but the array holds {}", i, value_type_name(items[i].type()),
           value_type_name(elem_type));
  }
  return Value(Data(std::in_place_type<Array>, Array{elem_type, std::move(items)}));
}

Value Value::string_array(std::span<const std::string> items) {
  std::vector<Value> values;
  values.reserve(items.size());
  for (const std::string& s : items) values.push_back(string(s));
  return Value(Data(std::in_place_type<Array>, Array{ValueType::String, std::move(values)}));
}

Value Value::i32_array(std::span<const int32_t> items) {
  std::vector<Value> values;
  values.reserve(items.size());
  for (int32_t v : items) values.push_back(i32(v));
  return Value(Data(std::in_place_type<Array>, Array{ValueType::I32, std::move(values)}));
}

Value Value::f32_array(std::span<const float> items) {
  std::vector<Value> values;
  values.reserve(items.size());
  for (float v : items) values.push_back(f32(v));
  return Value(Data(std::in_place_type<Array>, Array{ValueType::F32, std::move(values)}));
}

std::optional<int64_t> Value::as_int() const {
  return std::visit(
      [](const auto& v) -> std::optional<int64_t> {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, bool> || !std::is_integral_v<T>) {
          return std::nullopt;
        } else if constexpr (std::is_same_v<T, uint64_t>) {
          if (v > uint64_t(std::numeric_limits<int64_t>::max())) return std::nullopt;
          return int64_t(v);
        } else {
          return int64_t(v);
        }
      },
      data_);
}

std::optional<uint64_t> Value::as_uint() const {
  if (const uint64_t* v = std::get_if<uint64_t>(&data_)) return *v;
  const std::optional<int64_t> v = as_int();
  if (!v || *v < 0) return std::nullopt;
  return uint64_t(*v);
}

std::optional<double> Value::as_number() const {
  if (const float* f = std::get_if<float>(&data_)) return double(*f);
  if (const double* d = std::get_if<double>(&data_)) return *d;
  if (const uint64_t* u = std::get_if<uint64_t>(&data_)) return double(*u);
  if (const std::optional<int64_t> i = as_int()) return double(*i);
  return std::nullopt;
}

std::optional<bool> Value::as_bool() const {
  if (const bool* b = std::get_if<bool>(&data_)) return *b;
  return std::nullopt;
}

namespace {

// Long strings (chat templates run to kilobytes) are cut so a listing stays one screen wide.
constexpr size_t kMaxDisplayChars = 80;

std::string display_string(const std::string& s) {
  std::string out = "\"";
  const size_t shown = std::min(s.size(), kMaxDisplayChars);
  for (size_t i = 0; i < shown; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += char(c);
    }
  }
  out += '"';
  if (shown < s.size()) out += fmt::format("... ({} bytes)", s.size());
  return out;
}

}  // namespace

std::string Value::to_display(size_t max_items) const {
  return std::visit(
      [&](const auto& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) {
          return display_string(v);
        } else if constexpr (std::is_same_v<T, Array>) {
          std::string out = "[";
          const size_t shown = std::min(v.items.size(), max_items);
          for (size_t i = 0; i < shown; ++i) {
            if (i) out += ", ";
            out += v.items[i].to_display(max_items);
          }
          if (shown < v.items.size()) out += fmt::format(", ... ({} items)", v.items.size());
          return out + "]";
        } else if constexpr (std::is_same_v<T, bool>) {
          return v ? "true" : "false";
        } else if constexpr (std::is_same_v<T, uint8_t> || std::is_same_v<T, int8_t>) {
          return fmt::format("{}", int(v));  // not as a character
        } else {
          return fmt::format("{}", v);
        }
      },
      data_);
}

bool Value::operator==(const Value& other) const {
  return data_ == other.data_;
}

}  // namespace tandem::gguf

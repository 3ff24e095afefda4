#pragma once
// One GGUF metadata value. The reader produces them, the writer consumes them, and model code
// reads them through the typed accessors (as_int, as_string, ...), which say "not this type"
// with nullopt / nullptr instead of throwing, so callers can word their own errors.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace tandem::gguf {

// Numbered as the GGUF format numbers them on disk.
enum class ValueType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  Bool = 7,
  String = 8,
  Array = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};

inline constexpr uint32_t kValueTypeCount = 13;

// "u8", "string", "array", ... or "unknown" for a number outside the enum.
std::string_view value_type_name(ValueType type);

// Bytes a value of a fixed-size type occupies on disk; 0 for String and Array.
uint64_t value_type_fixed_size(ValueType type);

class Value;

// An array value: every item has type `elem_type` (arrays of arrays are allowed; their items
// may each hold a different element type, as GGUF permits).
struct Array {
  ValueType elem_type = ValueType::U8;
  std::vector<Value> items;
};

class Value {
 public:
  // The alternatives are in ValueType order, so index() is the on-disk type number.
  using Data = std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float, bool,
                            std::string, Array, uint64_t, int64_t, double>;

  Value() = default;  // u8 0
  explicit Value(Data data) : data_(std::move(data)) {}

  // Named constructors: the integer width is part of the file format, so it is spelled out
  // rather than left to C++ overload resolution.
  static Value u8(uint8_t v) { return Value(Data(std::in_place_type<uint8_t>, v)); }
  static Value i8(int8_t v) { return Value(Data(std::in_place_type<int8_t>, v)); }
  static Value u16(uint16_t v) { return Value(Data(std::in_place_type<uint16_t>, v)); }
  static Value i16(int16_t v) { return Value(Data(std::in_place_type<int16_t>, v)); }
  static Value u32(uint32_t v) { return Value(Data(std::in_place_type<uint32_t>, v)); }
  static Value i32(int32_t v) { return Value(Data(std::in_place_type<int32_t>, v)); }
  static Value f32(float v) { return Value(Data(std::in_place_type<float>, v)); }
  static Value boolean(bool v) { return Value(Data(std::in_place_type<bool>, v)); }
  static Value string(std::string v) {
    return Value(Data(std::in_place_type<std::string>, std::move(v)));
  }
  static Value u64(uint64_t v) { return Value(Data(std::in_place_type<uint64_t>, v)); }
  static Value i64(int64_t v) { return Value(Data(std::in_place_type<int64_t>, v)); }
  static Value f64(double v) { return Value(Data(std::in_place_type<double>, v)); }
  // Throws tandem::Error if an item's type differs from elem_type.
  static Value array(ValueType elem_type, std::vector<Value> items);
  static Value string_array(std::span<const std::string> items);
  static Value i32_array(std::span<const int32_t> items);
  static Value f32_array(std::span<const float> items);

  ValueType type() const { return ValueType(data_.index()); }
  const Data& data() const { return data_; }

  // Any integer type; a u64 above INT64_MAX gives nullopt. Bools are not integers.
  std::optional<int64_t> as_int() const;
  // Any non-negative integer (sizes, counts); negative values give nullopt.
  std::optional<uint64_t> as_uint() const;
  // Integers and floats.
  std::optional<double> as_number() const;
  std::optional<bool> as_bool() const;
  const std::string* as_string() const { return std::get_if<std::string>(&data_); }
  const Array* as_array() const { return std::get_if<Array>(&data_); }

  // A short human-readable rendering for `tandem inspect` and error messages: strings quoted,
  // arrays as "[a, b, c, ... (N items)]" showing at most max_items, long strings cut.
  std::string to_display(size_t max_items = 8) const;

  bool operator==(const Value& other) const;

 private:
  Data data_;
};

inline bool operator==(const Array& a, const Array& b) {
  return a.elem_type == b.elem_type && a.items == b.items;
}

}  // namespace tandem::gguf

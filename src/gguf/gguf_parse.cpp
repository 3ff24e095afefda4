#include "gguf/gguf_parse.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <bit>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace tandem::gguf::detail {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the GGUF reader reads fields in place and assumes a little-endian host");

// Smallest on-disk footprints, used to reject counts before anything is allocated: a file
// claiming 2^60 entries must fail on arithmetic, not on a reserve().
constexpr uint64_t kMinMetadataEntryBytes = 8 + 4 + 1;   // key length, type, 1-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;  // name length, n_dims, type, offset
constexpr uint64_t kMinStringBytes = 8;                  // the length field of an empty string
constexpr uint64_t kMinArrayBytes = 4 + 8;               // element type and count

std::string known_dtype_names() {
  std::string names;
  for (uint32_t n = 0; n < 64; ++n) {
    if (const auto info = find_dtype(n)) {
      if (!names.empty()) names += ", ";
      names += info->name;
    }
  }
  return names;
}

// Reads one image front to back. The field being read is tracked (section, key, array item
// path, tensor) so that any failure can say exactly where it happened, at no cost on success.
class Parser {
 public:
  Parser(std::span<const uint8_t> bytes, const std::string& file) : bytes_(bytes), file_(file) {}

  ParsedPart parse() {
    read_header();
    for (uint64_t i = 0; i < metadata_count_; ++i) read_metadata_entry(i);
    read_alignment();
    section_ = Section::Tensors;
    std::vector<RawTensor> raw(tensor_count_);
    for (uint64_t i = 0; i < tensor_count_; ++i) raw[i] = read_tensor_info(i);
    part_.data_offset = align_up(pos_, part_.alignment);
    part_.tensors.reserve(raw.size());
    for (uint64_t i = 0; i < raw.size(); ++i) add_tensor(i, std::move(raw[i]));
    return std::move(part_);
  }

 private:
  enum class Section { Header, Metadata, Tensors };
  struct RawTensor {
    std::string name;
    std::vector<uint64_t> shape;
    uint32_t type = 0;
    uint64_t offset = 0;
  };

  uint64_t remaining() const { return bytes_.size() - pos_; }

  // "metadata key 'k'[3][0]" (array items), "tensor 12 'blk.3.attn_q.weight'", "header".
  std::string field() const {
    switch (section_) {
      case Section::Header:
        return "header";
      case Section::Metadata: {
        if (!key_known_) return fmt::format("metadata entry {}", entry_index_);
        std::string out = fmt::format("metadata key '{}'", key_);
        for (uint64_t index : item_path_) out += fmt::format("[{}]", index);
        return out;
      }
      case Section::Tensors:
        if (tensor_name_.empty()) return fmt::format("tensor {}", entry_index_);
        return fmt::format("tensor {} '{}'", entry_index_, tensor_name_);
    }
    return "?";
  }

  template <class... Args>
  [[noreturn]] void fail_at(std::string_view what, fmt::format_string<Args...> problem,
                            Args&&... args) const {
    fail("{}: {} {}: {}", file_, field(), what, fmt::format(problem, std::forward<Args>(args)...));
  }

  void need(uint64_t n, std::string_view what) const {
    if (n > remaining())
      fail_at(what,
              "needs {} bytes at offset {} but the file ends at {}; the file is truncated: "
              "re-download it",
              n, pos_, bytes_.size());
  }

  template <class T>
  T read(std::string_view what) {
    need(sizeof(T), what);
    T value;
    std::memcpy(&value, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }

  // `length_what` is `what` + " length", passed as a literal to keep the success path free
  // of formatting.
  std::string read_string(std::string_view what, std::string_view length_what) {
    const uint64_t length = read<uint64_t>(length_what);
    if (length > remaining()) {
      if (length > bytes_.size())
        fail_at(what, "length {} is larger than the whole file ({} bytes); the file is corrupt",
                length, bytes_.size());
      fail_at(what,
              "length {} at offset {} runs past the end of the file ({} bytes left); the file "
              "is truncated: re-download it",
              length, pos_, remaining());
    }
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), size_t(length));
    pos_ += length;
    return s;
  }

  ValueType read_value_type(std::string_view what) {
    const uint32_t type = read<uint32_t>(what);
    if (type >= kValueTypeCount)
      fail_at(what,
              "unknown value type {} (known types are 0 to {}); the file is corrupt or from a "
              "newer GGUF version",
              type, kValueTypeCount - 1);
    return ValueType(type);
  }

  void read_header() {
    if (bytes_.size() < kHeaderBytes)
      fail(
          "{}: only {} bytes, too short for a GGUF header ({} bytes); the file is truncated: "
          "re-download it",
          file_, bytes_.size(), kHeaderBytes);
    const uint8_t* m = bytes_.data();
    const bool magic_ok = std::memcmp(m, kMagic, 4) == 0;
    const bool magic_swapped = m[0] == 'F' && m[1] == 'U' && m[2] == 'G' && m[3] == 'G';
    if (!magic_ok && !magic_swapped)
      fail(
          "{}: not a GGUF file: it starts with bytes {:02x} {:02x} {:02x} {:02x}, expected "
          "'GGUF'",
          file_, m[0], m[1], m[2], m[3]);
    pos_ = 4;
    const uint32_t version = read<uint32_t>("version");
    // A big-endian writer stores the version byte-swapped: small numbers land in the high
    // bytes, which no real little-endian version number has.
    if (magic_swapped || (version != 0 && (version & 0xffff) == 0))
      fail(
          "{}: this is a big-endian GGUF file (version field {:#x}); tandem reads "
          "little-endian GGUF only: convert the model again on a little-endian machine",
          file_, version);
    if (version == 1)
      fail(
          "{}: GGUF version 1 is not supported (only versions 2 and 3); convert the model "
          "again with a current converter",
          file_);
    if (version != 2 && version != 3)
      fail("{}: GGUF version {} is not supported (only versions 2 and 3)", file_, version);
    part_.version = version;
    tensor_count_ = read<uint64_t>("tensor count");
    metadata_count_ = read<uint64_t>("metadata count");
    if (metadata_count_ > remaining() / kMinMetadataEntryBytes)
      fail(
          "{}: header claims {} metadata entries but only {} bytes follow; the file is "
          "corrupt",
          file_, metadata_count_, remaining());
    // Tensor infos follow the metadata, so this bound is loose; the exact one comes later.
    if (tensor_count_ > remaining() / kMinTensorInfoBytes)
      fail("{}: header claims {} tensors but only {} bytes follow; the file is corrupt", file_,
           tensor_count_, remaining());
  }

  void read_metadata_entry(uint64_t index) {
    section_ = Section::Metadata;
    entry_index_ = index;
    key_known_ = false;
    std::string key = read_string("key", "key length");
    if (key.empty()) fail_at("key", "is empty");
    key_ = key;
    key_known_ = true;
    if (part_.metadata_index.count(key))
      fail("{}: metadata key '{}' appears twice; the file is corrupt", file_, key);
    const ValueType type = read_value_type("value type");
    Value value = read_value(type, 0);
    part_.metadata_index.emplace(key, part_.metadata.size());
    part_.metadata.emplace_back(std::move(key), std::move(value));
  }

  Value read_value(ValueType type, uint32_t depth) {
    switch (type) {
      case ValueType::U8:
        return Value::u8(read<uint8_t>("value"));
      case ValueType::I8:
        return Value::i8(read<int8_t>("value"));
      case ValueType::U16:
        return Value::u16(read<uint16_t>("value"));
      case ValueType::I16:
        return Value::i16(read<int16_t>("value"));
      case ValueType::U32:
        return Value::u32(read<uint32_t>("value"));
      case ValueType::I32:
        return Value::i32(read<int32_t>("value"));
      case ValueType::F32:
        return Value::f32(read<float>("value"));
      case ValueType::U64:
        return Value::u64(read<uint64_t>("value"));
      case ValueType::I64:
        return Value::i64(read<int64_t>("value"));
      case ValueType::F64:
        return Value::f64(read<double>("value"));
      case ValueType::Bool: {
        // Read as a byte: loading any other byte into a bool is undefined behaviour.
        const uint8_t b = read<uint8_t>("value");
        if (b > 1) fail_at("value", "bool value {} is neither 0 nor 1; the file is corrupt", b);
        return Value::boolean(b == 1);
      }
      case ValueType::String:
        return Value::string(read_string("string", "string length"));
      case ValueType::Array:
        return read_array(depth);
    }
    fail_at("value type", "unhandled type {}", uint32_t(type));
  }

  Value read_array(uint32_t depth) {
    if (depth >= kMaxArrayNesting)
      fail_at("array", "arrays are nested deeper than {} levels; the file is corrupt",
              kMaxArrayNesting);
    const ValueType elem_type = read_value_type("array item type");
    const uint64_t count = read<uint64_t>("array length");
    uint64_t min_item_bytes = value_type_fixed_size(elem_type);
    if (elem_type == ValueType::String) min_item_bytes = kMinStringBytes;
    if (elem_type == ValueType::Array) min_item_bytes = kMinArrayBytes;
    if (count > remaining() / min_item_bytes)
      fail_at("array length",
              "{} items of type {} need at least {} bytes each but only {} bytes remain; the "
              "file is truncated or corrupt",
              count, value_type_name(elem_type), min_item_bytes, remaining());
    Array array{elem_type, {}};
    array.items.reserve(size_t(count));
    item_path_.push_back(0);
    for (uint64_t i = 0; i < count; ++i) {
      item_path_.back() = i;
      array.items.push_back(read_value(elem_type, depth + 1));
    }
    item_path_.pop_back();
    return Value(Value::Data(std::in_place_type<Array>, std::move(array)));
  }

  void read_alignment() {
    const auto it = part_.metadata_index.find("general.alignment");
    if (it == part_.metadata_index.end()) return;
    const Value& value = part_.metadata[it->second].second;
    const std::optional<uint64_t> alignment = value.as_uint();
    if (!alignment)
      fail(
          "{}: metadata key 'general.alignment' is {} of type {}; expected an unsigned "
          "integer (u32)",
          file_, value.to_display(), value_type_name(value.type()));
    if (*alignment == 0 || !std::has_single_bit(*alignment) || *alignment > kMaxAlignment)
      fail(
          "{}: metadata key 'general.alignment' is {}; it must be a power of two between 1 "
          "and 2^20 (GGUF's default is 32); the file is corrupt",
          file_, *alignment);
    part_.alignment = *alignment;
  }

  RawTensor read_tensor_info(uint64_t index) {
    entry_index_ = index;
    tensor_name_.clear();
    RawTensor t;
    t.name = read_string("name", "name length");
    if (t.name.empty()) fail_at("name", "is empty; every tensor needs a name");
    tensor_name_ = t.name;
    const uint32_t n_dims = read<uint32_t>("n_dims");
    if (n_dims < 1 || n_dims > kMaxDims)
      fail_at("n_dims", "is {}; expected 1 to {}; the file is corrupt", n_dims, kMaxDims);
    t.shape.resize(n_dims);
    for (uint32_t d = 0; d < n_dims; ++d) t.shape[d] = read<uint64_t>("shape");
    t.type = read<uint32_t>("type");
    t.offset = read<uint64_t>("offset");
    return t;
  }

  void add_tensor(uint64_t index, RawTensor raw) {
    entry_index_ = index;
    tensor_name_ = raw.name;
    TANDEM_CHECK(part_.tensors.size() == index);
    const std::optional<DTypeInfo> info = find_dtype(raw.type);
    if (!info)
      fail_at("type",
              "unknown tensor type {}; this build knows {}; the file is corrupt or uses a "
              "format tandem does not support yet",
              raw.type, known_dtype_names());
    TensorInfo t;
    t.shape = std::move(raw.shape);
    t.type = info->type;
    // Counted against int64 so that any later signed index arithmetic on shapes is safe.
    uint64_t n_elements = 1;
    for (uint64_t dim : t.shape) {
      if (__builtin_mul_overflow(n_elements, dim, &n_elements) ||
          n_elements > uint64_t(std::numeric_limits<int64_t>::max()))
        fail_at("shape", "{} has more than 2^63 elements (overflow); the file is corrupt",
                fmt::join(t.shape, " x "));
    }
    if (t.shape[0] % info->block_elems != 0)
      fail_at("shape", "row length {} is not a multiple of {}'s block size {}; the file is corrupt",
              t.shape[0], info->name, info->block_elems);
    t.n_elements = n_elements;
    if (__builtin_mul_overflow(n_elements / info->block_elems, uint64_t(info->block_bytes),
                               &t.n_bytes))
      fail_at("shape", "{} of {} is more than 2^64 bytes; the file is corrupt",
              fmt::join(t.shape, " x "), info->name);
    if (raw.offset % part_.alignment != 0)
      fail_at("offset", "{} is not a multiple of the alignment {}; the file is corrupt", raw.offset,
              part_.alignment);
    uint64_t start = 0, end = 0;
    if (__builtin_add_overflow(part_.data_offset, raw.offset, &start) ||
        __builtin_add_overflow(start, t.n_bytes, &end) || end > bytes_.size())
      fail_at("data",
              "{} bytes at data offset {} (the data section starts at {}) lie beyond the end "
              "of the file ({} bytes); the file is truncated: re-download it",
              t.n_bytes, raw.offset, part_.data_offset, bytes_.size());
    const auto it = tensor_names_.find(raw.name);
    if (it != tensor_names_.end())
      fail_at("name", "appears twice (also tensor {}); the file is corrupt", it->second);
    tensor_names_.emplace(raw.name, index);
    t.name = std::move(raw.name);
    t.file_offset = start;
    t.data = bytes_.data() + start;
    part_.tensors.push_back(std::move(t));
  }

  std::span<const uint8_t> bytes_;
  const std::string& file_;
  uint64_t pos_ = 0;
  uint64_t tensor_count_ = 0;
  uint64_t metadata_count_ = 0;
  ParsedPart part_;
  std::unordered_map<std::string, uint64_t> tensor_names_;

  // Where we are, for messages.
  Section section_ = Section::Header;
  uint64_t entry_index_ = 0;
  bool key_known_ = false;
  std::string key_;
  std::vector<uint64_t> item_path_;
  std::string tensor_name_;
};

}  // namespace

ParsedPart parse_part(std::span<const uint8_t> bytes, const std::string& file) {
  return Parser(bytes, file).parse();
}

}  // namespace tandem::gguf::detail

#include "gguf/gguf_file.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/error.h"
#include "core/fnv_hash.h"
#include "core/progress.h"
#include "gguf/gguf_parse.h"

namespace tandem::gguf {
namespace {

// Split-model metadata keys, as written by the usual split tool.
constexpr std::string_view kSplitNo = "split.no";  // 0-based part index
constexpr std::string_view kSplitCount = "split.count";
constexpr std::string_view kSplitTensorsCount = "split.tensors.count";

// Reads an optional non-negative integer key, with a message naming the part.
std::optional<uint64_t> split_key(const std::vector<std::pair<std::string, Value>>& metadata,
                                  const std::unordered_map<std::string, size_t>& index,
                                  std::string_view key, const std::string& file) {
  const auto it = index.find(std::string(key));
  if (it == index.end()) return std::nullopt;
  const Value& value = metadata[it->second].second;
  const std::optional<uint64_t> n = value.as_uint();
  if (!n)
    fail("{}: metadata key '{}' is {} of type {}; expected a non-negative integer", file, key,
         value.to_display(), value_type_name(value.type()));
  return n;
}

std::optional<uint64_t> split_key(const detail::ParsedPart& part, std::string_view key,
                                  const std::string& file) {
  return split_key(part.metadata, part.metadata_index, key, file);
}

bool all_digits(std::string_view s) {
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return !s.empty();
}

}  // namespace

std::optional<SplitName> parse_split_name(const std::string& path) {
  // NAME-00001-of-00003.gguf: the two numbers are exactly five digits.
  constexpr std::string_view kSuffix = ".gguf";
  constexpr size_t kTail = 1 + 5 + 4 + 5 + 5;  // "-00001-of-00003.gguf"
  if (path.size() <= kTail) return std::nullopt;
  const std::string_view tail = std::string_view(path).substr(path.size() - kTail);
  if (tail[0] != '-' || tail.substr(6, 4) != "-of-" || tail.substr(15) != kSuffix)
    return std::nullopt;
  const std::string_view index = tail.substr(1, 5), count = tail.substr(10, 5);
  if (!all_digits(index) || !all_digits(count)) return std::nullopt;
  SplitName name;
  name.prefix = path.substr(0, path.size() - kTail);
  name.index = uint32_t(std::stoul(std::string(index)));
  name.count = uint32_t(std::stoul(std::string(count)));
  if (name.index < 1 || name.count < 1 || name.index > name.count) return std::nullopt;
  return name;
}

std::string split_path(const std::string& prefix, uint32_t index, uint32_t count) {
  return fmt::format("{}-{:05}-of-{:05}.gguf", prefix, index, count);
}

GgufFile GgufFile::parse_memory(std::span<const uint8_t> bytes, std::string name) {
  GgufFile file;
  detail::ParsedPart part = detail::parse_part(bytes, name);
  file.paths_.push_back(std::move(name));
  file.version_ = part.version;
  file.alignment_ = part.alignment;
  file.metadata_ = std::move(part.metadata);
  file.metadata_index_ = std::move(part.metadata_index);
  file.tensors_ = std::move(part.tensors);
  file.total_file_bytes_ = bytes.size();
  file.index_tensors();
  return file;
}

std::string GgufFile::lock_in_memory(bool show_progress) const {
  uint64_t total = 0;
  for (const MappedFile& map : maps_) total += map.size();
  Progress progress("locking the model in RAM", total, show_progress);
  // Pieces of 256 MiB so the progress line moves while a cold file is read from disk.
  constexpr size_t kPiece = size_t(256) << 20;
  for (const MappedFile& map : maps_) {
    for (size_t offset = 0; offset < map.size(); offset += kPiece) {
      const size_t bytes = std::min(kPiece, map.size() - offset);
      if (std::string error = map.lock_in_memory(offset, bytes); !error.empty())
        return fmt::format("{} after {} of {}", error, format_bytes(offset), map.path());
      progress.advance(bytes);
    }
  }
  progress.finish();
  return {};
}

size_t GgufFile::map_cached_pages() const {
  size_t mapped = 0;
  for (const MappedFile& map : maps_) mapped += map.map_cached_pages();
  return mapped;
}

size_t GgufFile::huge_mapped_bytes() const {
  size_t bytes = 0;
  for (const MappedFile& map : maps_) bytes += map.huge_mapped_bytes();
  return bytes;
}

const MappedFile* GgufFile::part_holding(const void* data, size_t bytes, size_t* offset) const {
  const auto* p = static_cast<const uint8_t*>(data);
  for (const MappedFile& map : maps_)
    if (p >= map.data() && bytes <= map.size() && size_t(p - map.data()) <= map.size() - bytes) {
      *offset = size_t(p - map.data());
      return &map;
    }
  return nullptr;
}

bool GgufFile::start_reading(const void* data, size_t bytes, bool urgent) const {
  size_t offset = 0;
  const MappedFile* map = part_holding(data, bytes, &offset);
  if (!map || map->fully_cached(offset, bytes)) return false;
  if (!reader_) reader_ = std::make_unique<BackgroundReader>();
  reader_->start_reading(*map, offset, bytes, urgent);
  return true;
}

GgufFile GgufFile::open(const std::string& path) {
  GgufFile file;
  file.maps_.emplace_back(path);
  detail::ParsedPart first = detail::parse_part(file.maps_[0].bytes(), path);

  // How many parts: the name says so, and split.count (when present) must agree.
  const std::optional<SplitName> split = parse_split_name(path);
  const std::optional<uint64_t> meta_count = split_key(first, kSplitCount, path);
  const std::optional<uint64_t> meta_no = split_key(first, kSplitNo, path);
  uint64_t count = split ? split->count : 1;
  if (meta_count && *meta_count > 1 && !split)
    fail(
        "{}: the file is part of a split model ({} = {}), but its name does not follow the "
        "NAME-00001-of-{:05}.gguf pattern that locates the other parts; rename the parts",
        path, kSplitCount, *meta_count, *meta_count);
  if (meta_count && split && *meta_count != split->count)
    fail("{}: the name says {} parts but metadata {} says {}; the parts do not belong together",
         path, split->count, kSplitCount, *meta_count);
  if (meta_count && !split) count = *meta_count;
  if (meta_no && split && *meta_no != split->index - 1)
    fail(
        "{}: metadata {} is {} but the file name says part {} (split.no counts from 0); the "
        "file was renamed or the parts were mixed up",
        path, kSplitNo, *meta_no, split->index);
  const uint64_t first_no = meta_no ? *meta_no : (split ? split->index - 1 : 0);
  if (count > 1 && first_no != 0)
    fail("{}: this is part {} of {} of a split model; open the first part '{}'", path, first_no + 1,
         count, split_path(split->prefix, 1, uint32_t(count)));

  file.paths_.push_back(path);
  file.version_ = first.version;
  file.alignment_ = first.alignment;
  file.metadata_ = std::move(first.metadata);
  file.metadata_index_ = std::move(first.metadata_index);
  file.tensors_ = std::move(first.tensors);
  file.total_file_bytes_ = file.maps_[0].size();

  for (uint32_t i = 1; i < count; ++i) {
    const std::string part_path = split_path(split->prefix, i + 1, uint32_t(count));
    if (!std::filesystem::exists(part_path))
      fail(
          "{}: part {} of {} of this split model is missing: expected '{}'; put all parts in "
          "the same folder",
          path, i + 1, count, part_path);
    file.maps_.emplace_back(part_path);
    detail::ParsedPart part = detail::parse_part(file.maps_.back().bytes(), part_path);
    const std::optional<uint64_t> part_count = split_key(part, kSplitCount, part_path);
    const std::optional<uint64_t> part_no = split_key(part, kSplitNo, part_path);
    if (part_count && *part_count != count)
      fail("{}: metadata {} is {} but the first part says {}; the parts do not belong together",
           part_path, kSplitCount, *part_count, count);
    if (part_no && *part_no != i)
      fail(
          "{}: metadata {} is {} but the file name says part {} (split.no counts from 0); the "
          "parts do not belong together",
          part_path, kSplitNo, *part_no, i + 1);
    for (TensorInfo& t : part.tensors) {
      t.file_index = i;
      file.tensors_.push_back(std::move(t));
    }
    file.paths_.push_back(part_path);
    file.total_file_bytes_ += file.maps_.back().size();
  }

  if (const auto expected =
          split_key(file.metadata_, file.metadata_index_, kSplitTensorsCount, path)) {
    if (count > 1 && *expected != file.tensors_.size())
      fail(
          "{}: metadata {} says {} tensors but the {} parts hold {}; a part is missing or "
          "belongs to another model",
          path, kSplitTensorsCount, *expected, count, file.tensors_.size());
  }
  file.index_tensors();
  return file;
}

void GgufFile::index_tensors() {
  tensor_index_.clear();
  tensor_index_.reserve(tensors_.size());
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorInfo& t = tensors_[i];
    const auto [it, inserted] = tensor_index_.emplace(t.name, i);
    if (!inserted) {
      const TensorInfo& other = tensors_[it->second];
      fail("{}: tensor '{}' appears in both '{}' and '{}'; the parts do not belong together",
           name(), t.name, paths_[other.file_index], paths_[t.file_index]);
    }
  }
}

const Value* GgufFile::find(std::string_view key) const {
  const auto it = metadata_index_.find(std::string(key));
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].second;
}

const TensorInfo* GgufFile::find_tensor(std::string_view tensor_name) const {
  const auto it = tensor_index_.find(std::string(tensor_name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

void GgufFile::wrong_type(std::string_view key, const Value& value,
                          std::string_view expected) const {
  fail("{}: metadata key '{}' has type {}, expected {}", name(), key, value_type_name(value.type()),
       expected);
}

namespace {
[[noreturn]] void missing(const std::string& file, std::string_view key) {
  fail("{}: metadata key '{}' is missing", file, key);
}
}  // namespace

std::string GgufFile::get_string(std::string_view key) const {
  const Value* value = find(key);
  if (!value) missing(name(), key);
  if (const std::string* s = value->as_string()) return *s;
  wrong_type(key, *value, "string");
}

int64_t GgufFile::get_int(std::string_view key) const {
  const Value* value = find(key);
  if (!value) missing(name(), key);
  if (const std::optional<int64_t> v = value->as_int()) return *v;
  if (value->type() == ValueType::U64)
    fail("{}: metadata key '{}' is {}, too large for a signed 64-bit integer", name(), key,
         value->to_display());
  wrong_type(key, *value, "an integer");
}

double GgufFile::get_number(std::string_view key) const {
  const Value* value = find(key);
  if (!value) missing(name(), key);
  if (const std::optional<double> v = value->as_number()) return *v;
  wrong_type(key, *value, "a number");
}

bool GgufFile::get_bool(std::string_view key) const {
  const Value* value = find(key);
  if (!value) missing(name(), key);
  if (const std::optional<bool> v = value->as_bool()) return *v;
  wrong_type(key, *value, "bool");
}

const Array& GgufFile::get_array(std::string_view key, std::optional<ValueType> elem_type) const {
  const Value* value = find(key);
  if (!value) missing(name(), key);
  const Array* array = value->as_array();
  if (!array)
    wrong_type(key, *value,
               elem_type ? fmt::format("array of {}", value_type_name(*elem_type)) : "array");
  if (elem_type && array->elem_type != *elem_type)
    fail("{}: metadata key '{}' is an array of {}, expected an array of {}", name(), key,
         value_type_name(array->elem_type), value_type_name(*elem_type));
  return *array;
}

std::string GgufFile::get_string_or(std::string_view key, std::string fallback) const {
  return find(key) ? get_string(key) : std::move(fallback);
}

int64_t GgufFile::get_int_or(std::string_view key, int64_t fallback) const {
  return find(key) ? get_int(key) : fallback;
}

double GgufFile::get_number_or(std::string_view key, double fallback) const {
  return find(key) ? get_number(key) : fallback;
}

bool GgufFile::get_bool_or(std::string_view key, bool fallback) const {
  return find(key) ? get_bool(key) : fallback;
}

uint64_t GgufFile::header_fingerprint() const {
  uint64_t header_bytes = total_file_bytes();
  for (const TensorInfo& t : tensors())
    if (t.file_index == 0) header_bytes = std::min(header_bytes, t.file_offset);
  std::ifstream in(paths().front(), std::ios::binary);
  std::vector<char> header(size_t(std::min<uint64_t>(header_bytes, uint64_t(64) << 20)));
  if (!in.read(header.data(), std::streamsize(header.size())))
    fail("{}: cannot read its header back", name());
  Fnv1a hash;
  hash.mix(total_file_bytes());
  hash.mix_bytes(std::string_view(header.data(), header.size()));
  return hash.value();
}

}  // namespace tandem::gguf

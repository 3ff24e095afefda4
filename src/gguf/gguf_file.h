#pragma once
// A GGUF model file (v2 or v3, little-endian), or all parts of a split model, opened read-only.
// Tensor data is used in place from the memory map: TensorInfo::data points into it and stays
// valid as long as the GgufFile lives (moving the GgufFile keeps the pointers valid).
//
// Every count, size and offset in the file is checked against the bytes actually present
// before it is used, so a corrupt or hostile file gives a tandem::Error naming the file and
// the field, never a crash or a huge allocation.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/background_reader.h"
#include "core/dtype.h"
#include "core/mapped_file.h"
#include "gguf/gguf_value.h"

namespace tandem::gguf {

inline constexpr uint64_t kDefaultAlignment = 32;
// The largest alignment read or written. Files use 32 to 4096; a larger one is a corrupt field
// (accepting up to 2^30 let a 60-byte file make a rewrite pad 1 GiB in memory: the fuzzer).
inline constexpr uint64_t kMaxAlignment = uint64_t(1) << 20;
// n_dims above this is rejected (ggml tensors have at most 4 dimensions).
inline constexpr uint32_t kMaxDims = 4;
// Arrays of arrays deeper than this are rejected; real files nest at most 2 levels.
inline constexpr uint32_t kMaxArrayNesting = 8;

struct TensorInfo {
  std::string name;
  std::vector<uint64_t> shape;  // GGUF order: shape[0] is the contiguous row length
  DType type = DType::F32;
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;
  uint32_t file_index = 0;   // which file of a split model holds the data
  uint64_t file_offset = 0;  // absolute offset of the data in that file
  const uint8_t* data = nullptr;

  std::span<const uint8_t> bytes() const { return {data, size_t(n_bytes)}; }
};

// Bytes [offset, offset + bytes) of part `file_index` of a (possibly split) model.
struct FileRange {
  uint32_t file_index = 0;
  uint64_t offset = 0, bytes = 0;
};

class GgufFile {
 public:
  // Maps `path` and, when it is the first part of a split model (NAME-00001-of-0000N.gguf),
  // every sibling part from the same folder.
  static GgufFile open(const std::string& path);
  // Parses one GGUF image held in memory (no splits followed); data pointers point into
  // `bytes`, which must outlive the result. `name` is used in error messages.
  static GgufFile parse_memory(std::span<const uint8_t> bytes, std::string name);

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  // The first path, or the name given to parse_memory; used to prefix messages.
  const std::string& name() const { return paths_.front(); }
  const std::vector<std::string>& paths() const { return paths_; }

  // The first file's metadata, in file order.
  const std::vector<std::pair<std::string, Value>>& metadata() const { return metadata_; }
  const Value* find(std::string_view key) const;

  // Typed getters; they throw tandem::Error "FILE: metadata key 'K' is missing" or
  // "FILE: metadata key 'K' has type X, expected Y".
  std::string get_string(std::string_view key) const;
  int64_t get_int(std::string_view key) const;  // any integer type that fits in int64
  double get_number(std::string_view key) const;
  bool get_bool(std::string_view key) const;
  // Checks the element type too when one is given.
  const Array& get_array(std::string_view key,
                         std::optional<ValueType> elem_type = std::nullopt) const;

  // The same with a default for a missing key (a present key of the wrong type still throws).
  std::string get_string_or(std::string_view key, std::string fallback) const;
  int64_t get_int_or(std::string_view key, int64_t fallback) const;
  double get_number_or(std::string_view key, double fallback) const;
  bool get_bool_or(std::string_view key, bool fallback) const;

  // All tensors of all parts, in file order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;

  uint64_t total_file_bytes() const { return total_file_bytes_; }
  // The file's size and its first part's header (metadata and tensor index, up to the first
  // tensor's data) hashed (FNV-1a): what tells two copies of one model apart from two models
  // (ranks of a run check they hold the same; a repacked copy remembers its source's).
  uint64_t header_fingerprint() const;

  // Locks every part in RAM (--mlock), with a progress line on stderr while pages are read.
  // Returns the system's reason when the lock fails part-way (what was locked stays locked);
  // empty on success.
  std::string lock_in_memory(bool show_progress) const;
  // MappedFile::map_cached_pages for every part; returns the bytes mapped.
  size_t map_cached_pages() const;
  // MappedFile::huge_mapped_bytes summed over the parts.
  size_t huge_mapped_bytes() const;
  // Starts reading bytes of a tensor (or a part of one), given by where they are in memory, on
  // a background thread (core/background_reader.h) when the page cache lacks some of them
  // (then true); nothing for memory outside the mapped parts (parse_memory). `urgent`: needed
  // by the step running now, read before the others. Cached weights are never asked for again:
  // measured, read-ahead advice on cached, mapped weights made the next decode tokens up to 2x
  // slower.
  bool start_reading(const void* data, size_t bytes, bool urgent) const;

 private:
  GgufFile() = default;
  [[noreturn]] void wrong_type(std::string_view key, const Value& value,
                               std::string_view expected) const;
  void index_tensors();
  // The mapped part holding [data, data + bytes) and the offset of data in it; null if none.
  const MappedFile* part_holding(const void* data, size_t bytes, size_t* offset) const;

  std::vector<MappedFile> maps_;  // empty for parse_memory
  // Started by the first start_reading (most runs never need it); after maps_, so it stops
  // before the maps it reads go away.
  mutable std::unique_ptr<BackgroundReader> reader_;
  std::vector<std::string> paths_;
  uint32_t version_ = 0;
  uint64_t alignment_ = kDefaultAlignment;
  std::vector<std::pair<std::string, Value>> metadata_;
  std::unordered_map<std::string, size_t> metadata_index_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
  uint64_t total_file_bytes_ = 0;
};

// Splits "DIR/NAME-00002-of-00005.gguf" into its parts; nullopt when the name does not follow
// the split naming. `index` is 1-based as in the name.
struct SplitName {
  std::string prefix;  // "DIR/NAME"
  uint32_t index = 0;
  uint32_t count = 0;
};
std::optional<SplitName> parse_split_name(const std::string& path);
std::string split_path(const std::string& prefix, uint32_t index, uint32_t count);

}  // namespace tandem::gguf

#pragma once
// Internal: parsing of one GGUF image (one part of a possibly split model). GgufFile puts the
// parts together; this file knows nothing about splits or mmap.
#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "gguf/gguf_file.h"

namespace tandem::gguf::detail {

inline constexpr char kMagic[4] = {'G', 'G', 'U', 'F'};
// magic(4) + version(4) + tensor count(8) + metadata count(8)
inline constexpr uint64_t kHeaderBytes = 24;

struct ParsedPart {
  uint32_t version = 0;
  uint64_t alignment = kDefaultAlignment;
  uint64_t data_offset = 0;  // start of the data section (may equal the file size)
  std::vector<std::pair<std::string, Value>> metadata;
  std::unordered_map<std::string, size_t> metadata_index;
  // file_index is 0; data points into the parsed bytes.
  std::vector<TensorInfo> tensors;
};

// Throws tandem::Error prefixed with `file` for anything malformed.
ParsedPart parse_part(std::span<const uint8_t> bytes, const std::string& file);

inline uint64_t align_up(uint64_t offset, uint64_t alignment) {
  return offset + (alignment - offset % alignment) % alignment;
}

}  // namespace tandem::gguf::detail

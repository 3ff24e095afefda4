#include "gguf/gguf_writer.h"

#include <fmt/format.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include "core/error.h"
#include "gguf/gguf_parse.h"

namespace tandem::gguf {
namespace {

constexpr uint32_t kVersion = 3;
constexpr std::string_view kAlignmentKey = "general.alignment";
// stdio's default buffer makes one syscall per 4 KiB; large pieces bypass it anyway.
constexpr size_t kFileBufferBytes = size_t(1) << 20;

void check_alignment(const std::string& path, uint64_t alignment) {
  if (alignment == 0 || !std::has_single_bit(alignment) || alignment > kMaxAlignment)
    fail("{}: alignment {} is not a power of two up to 2^20", path, alignment);
}

// Removes what we created, but only a regular file: a writer pointed at a device (/dev/null,
// /dev/full) must never delete it, even when running as root.
void remove_partial(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(path, ec)) std::filesystem::remove(path, ec);
}

}  // namespace

GgufWriter::GgufWriter(std::string path, uint64_t alignment)
    : path_(std::move(path)), alignment_(alignment) {
  check_alignment(path_, alignment_);
  file_ = std::fopen(path_.c_str(), "wb");
  if (!file_) fail("{}: cannot create: {}", path_, std::strerror(errno));
  std::setvbuf(file_, nullptr, _IOFBF, kFileBufferBytes);
}

GgufWriter::GgufWriter(std::vector<uint8_t>* out, uint64_t alignment)
    : path_("<memory>"), memory_(out), alignment_(alignment) {
  TANDEM_CHECK(out != nullptr);
  check_alignment(path_, alignment_);
}

GgufWriter::GgufWriter(std::span<uint8_t> out, std::string name, uint64_t alignment)
    : path_(std::move(name)), buffer_(out), alignment_(alignment) {
  check_alignment(path_, alignment_);
}

GgufWriter::~GgufWriter() {
  if (file_) {
    std::fclose(file_);
    if (!finished_) remove_partial(path_);
  }
}

void GgufWriter::check_open(std::string_view what) const {
  if (finished_) fail("{}: cannot {}: the file is already finished", path_, what);
  if (header_written_) fail("{}: cannot {} after the header was written", path_, what);
}

void GgufWriter::add_metadata(std::string key, Value value) {
  check_open(fmt::format("add metadata key '{}'", key));
  if (key.empty()) fail("{}: metadata key is empty", path_);
  if (metadata_index_.count(key)) fail("{}: metadata key '{}' added twice", path_, key);
  if (key == kAlignmentKey) {
    const std::optional<uint64_t> alignment = value.as_uint();
    if (!alignment)
      fail("{}: metadata key '{}' must be an unsigned integer, got {}", path_, key,
           value_type_name(value.type()));
    check_alignment(path_, *alignment);
    if (!tensors_.empty() && *alignment != alignment_)
      fail("{}: set '{}' before declaring tensors: their offsets depend on it", path_, key);
    alignment_ = *alignment;
    alignment_in_metadata_ = true;
  }
  metadata_index_.emplace(key, metadata_.size());
  metadata_.emplace_back(std::move(key), std::move(value));
}

void GgufWriter::add_tensor(std::string name, DType type, std::vector<uint64_t> shape) {
  check_open(fmt::format("declare tensor '{}'", name));
  if (name.empty()) fail("{}: tensor name is empty", path_);
  if (tensor_index_.count(name)) fail("{}: tensor '{}' declared twice", path_, name);
  if (shape.empty() || shape.size() > kMaxDims)
    fail("{}: tensor '{}' has {} dimensions; expected 1 to {}", path_, name, shape.size(),
         kMaxDims);
  const DTypeInfo& info = dtype_info(type);
  if (shape[0] % info.block_elems != 0)
    fail("{}: tensor '{}' row length {} is not a multiple of {}'s block size {}", path_, name,
         shape[0], info.name, info.block_elems);
  uint64_t n_elements = 1;
  for (uint64_t dim : shape)
    if (__builtin_mul_overflow(n_elements, dim, &n_elements) ||
        n_elements > uint64_t(std::numeric_limits<int64_t>::max()))
      fail("{}: tensor '{}' has more than 2^63 elements", path_, name);
  Declared t{std::move(name), type, std::move(shape)};
  if (__builtin_mul_overflow(n_elements / info.block_elems, uint64_t(info.block_bytes), &t.n_bytes))
    fail("{}: tensor '{}' is more than 2^64 bytes", path_, t.name);
  t.offset = detail::align_up(data_end_, alignment_);
  if (__builtin_add_overflow(t.offset, t.n_bytes, &data_end_))
    fail("{}: tensors add up to more than 2^64 bytes", path_);
  tensor_index_.emplace(t.name, tensors_.size());
  tensors_.push_back(std::move(t));
}

void GgufWriter::emit(const void* data, size_t n) {
  if (n == 0) return;
  if (memory_) {
    const uint8_t* p = static_cast<const uint8_t*>(data);
    memory_->insert(memory_->end(), p, p + n);
  } else if (buffer_.data()) {
    if (n > buffer_.size() - pos_)
      fail("{}: the image outgrew its buffer of {} bytes", path_, buffer_.size());
    std::memcpy(buffer_.data() + pos_, data, n);
  } else if (std::fwrite(data, 1, n, file_) != n) {
    write_failed(errno);
  }
  pos_ += n;
}

void GgufWriter::write_failed(int err) {
  // Close and remove now: a later finish() must not report success on a damaged file.
  std::fclose(file_);
  file_ = nullptr;
  remove_partial(path_);
  fail("{}: cannot write at byte {}: {}; check the free disk space", path_, pos_,
       err ? std::strerror(err) : "write error");
}

void GgufWriter::emit_string(std::string_view s) {
  emit_u64(s.size());
  emit(s.data(), s.size());
}

void GgufWriter::emit_value(std::string_view key, const Value& value, uint32_t depth) {
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) {
          emit_string(v);
        } else if constexpr (std::is_same_v<T, Array>) {
          // The same limit as the reader's, so every file we write can be read back.
          if (depth >= kMaxArrayNesting)
            fail("{}: metadata key '{}' nests arrays deeper than {} levels", path_, key,
                 kMaxArrayNesting);
          emit_u32(uint32_t(v.elem_type));
          emit_u64(v.items.size());
          for (size_t i = 0; i < v.items.size(); ++i) {
            if (v.items[i].type() != v.elem_type)
              fail("{}: metadata key '{}' item {} has type {}, but the array holds {}", path_, key,
                   i, value_type_name(v.items[i].type()), value_type_name(v.elem_type));
            emit_value(key, v.items[i], depth + 1);
          }
        } else if constexpr (std::is_same_v<T, bool>) {
          const uint8_t b = v ? 1 : 0;
          emit(&b, 1);
        } else {
          emit(&v, sizeof v);
        }
      },
      value.data());
}

void GgufWriter::pad_to(uint64_t target_pos) {
  static constexpr uint8_t kZeros[256] = {};
  TANDEM_CHECK(target_pos >= pos_);
  while (pos_ < target_pos) emit(kZeros, size_t(std::min<uint64_t>(target_pos - pos_, 256)));
}

void GgufWriter::write_header() {
  check_open("write the header");
  if (!alignment_in_metadata_ && alignment_ != kDefaultAlignment)
    add_metadata(std::string(kAlignmentKey), Value::u32(uint32_t(alignment_)));
  header_written_ = true;
  emit(detail::kMagic, 4);
  emit_u32(kVersion);
  emit_u64(tensors_.size());
  emit_u64(metadata_.size());
  for (const auto& [key, value] : metadata_) {
    emit_string(key);
    emit_u32(uint32_t(value.type()));
    emit_value(key, value, 0);
  }
  for (const Declared& t : tensors_) {
    emit_string(t.name);
    emit_u32(uint32_t(t.shape.size()));
    for (uint64_t dim : t.shape) emit_u64(dim);
    emit_u32(uint32_t(t.type));
    emit_u64(t.offset);
  }
  pad_to(detail::align_up(pos_, alignment_));
  data_start_ = pos_;
}

void GgufWriter::write_tensor_data(std::string_view name, std::span<const uint8_t> piece) {
  if (finished_) fail("{}: cannot write tensor '{}': the file is already finished", path_, name);
  if (!header_written_) write_header();
  // Move past completed tensors (zero-byte ones included) until `name` is reached.
  while (current_ < tensors_.size() && tensors_[current_].name != name &&
         tensors_[current_].written == tensors_[current_].n_bytes)
    ++current_;
  const auto it = tensor_index_.find(std::string(name));
  if (it == tensor_index_.end()) fail("{}: no tensor '{}' was declared", path_, name);
  if (current_ >= tensors_.size() || tensors_[current_].name != name) {
    if (it->second < current_)
      fail(
          "{}: tensor '{}' was already written completely; tensors are written in "
          "declaration order",
          path_, name);
    const Declared& expected = tensors_[current_];
    fail(
        "{}: got data for tensor '{}' but tensor '{}' still needs {} of its {} bytes; tensors "
        "are written in declaration order",
        path_, name, expected.name, expected.n_bytes - expected.written, expected.n_bytes);
  }
  Declared& t = tensors_[current_];
  if (piece.size() > t.n_bytes - t.written)
    fail("{}: tensor '{}' is {} bytes; a piece of {} bytes after {} written runs past its end",
         path_, name, t.n_bytes, piece.size(), t.written);
  if (t.written == 0) pad_to(data_start_ + t.offset);
  emit(piece.data(), piece.size());
  t.written += piece.size();
}

void GgufWriter::finish() {
  if (finished_) return;
  if (!header_written_) write_header();
  for (const Declared& t : tensors_) {
    if (t.written != t.n_bytes)
      fail("{}: tensor '{}' got {} of its {} bytes; the file is incomplete", path_, t.name,
           t.written, t.n_bytes);
  }
  pad_to(data_start_ + detail::align_up(data_end_, alignment_));
  if (file_) {
    const bool flushed = std::fflush(file_) == 0;
    const int err = errno;
    if (!flushed) write_failed(err);
    if (std::fclose(file_) != 0) {
      file_ = nullptr;
      const int close_err = errno;
      remove_partial(path_);
      fail("{}: cannot write: {}; check the free disk space", path_, std::strerror(close_err));
    }
    file_ = nullptr;
  }
  finished_ = true;
}

namespace {

void write_all(GgufWriter& writer, const std::vector<std::pair<std::string, Value>>& metadata,
               std::span<const TensorToWrite> tensors) {
  for (const auto& [key, value] : metadata) writer.add_metadata(key, value);
  for (const TensorToWrite& t : tensors) writer.add_tensor(t.name, t.type, t.shape);
  writer.write_header();
  for (const TensorToWrite& t : tensors) writer.write_tensor_data(t.name, t.data);
  writer.finish();
}

}  // namespace

void write_gguf(const std::string& path, const std::vector<std::pair<std::string, Value>>& metadata,
                std::span<const TensorToWrite> tensors, uint64_t alignment) {
  GgufWriter writer(path, alignment);
  write_all(writer, metadata, tensors);
}

std::vector<uint8_t> write_gguf_to_memory(
    const std::vector<std::pair<std::string, Value>>& metadata,
    std::span<const TensorToWrite> tensors, uint64_t alignment) {
  std::vector<uint8_t> out;
  GgufWriter writer(&out, alignment);
  write_all(writer, metadata, tensors);
  return out;
}

}  // namespace tandem::gguf

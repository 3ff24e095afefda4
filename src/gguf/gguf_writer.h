#pragma once
// Writes GGUF v3 files with bounded memory: declare metadata and tensors (name, type, shape),
// then stream each tensor's bytes in declaration order, in as many pieces as convenient. The
// header, with every tensor's offset, is computed from the declarations and written before the
// first data byte, so a 10 GB model never has to be held in memory.
//
//   GgufWriter w("out.gguf");
//   w.add_metadata("general.architecture", Value::string("deepseek2"));
//   w.add_tensor("token_embd.weight", DType::Q8_0, {hidden, vocab});
//   for (each row block) w.write_tensor_data("token_embd.weight", bytes);
//   w.finish();
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_value.h"

namespace tandem::gguf {

class GgufWriter {
 public:
  // Creates (or truncates) `path`. Errors name the path and the system's reason.
  explicit GgufWriter(std::string path, uint64_t alignment = kDefaultAlignment);
  // Appends the image to `out` instead (tests, fuzz seeds); `out` must outlive the writer.
  explicit GgufWriter(std::vector<uint8_t>* out, uint64_t alignment = kDefaultAlignment);
  // Writes the image into `out` from its start (--repack-in-memory: a buffer on 2 MiB pages);
  // an image that outgrows it is an error naming `name`.
  GgufWriter(std::span<uint8_t> out, std::string name, uint64_t alignment = kDefaultAlignment);
  // Without a successful finish() the file is removed, so an interrupted or failed conversion
  // never leaves a file that looks like a complete model.
  ~GgufWriter();
  GgufWriter(const GgufWriter&) = delete;
  GgufWriter& operator=(const GgufWriter&) = delete;

  // Kept in insertion order. A "general.alignment" entry sets the alignment (it must be an
  // unsigned power of two); otherwise the key is added when the alignment is not 32.
  void add_metadata(std::string key, Value value);
  // Declares a tensor; its data offset follows from the declarations before it.
  void add_tensor(std::string name, DType type, std::vector<uint64_t> shape);

  // Writes magic, counts, metadata and tensor infos; no declarations after this. Called by the
  // first write_tensor_data() or finish() when not called before.
  void write_header();
  // Appends the next bytes of tensor `name`. Tensors are filled in declaration order; a piece
  // may not run past the tensor's size.
  void write_tensor_data(std::string_view name, std::span<const uint8_t> piece);
  // Checks that every tensor got exactly its bytes, pads, flushes and closes.
  void finish();

  const std::string& path() const { return path_; }
  uint64_t bytes_written() const { return pos_; }

 private:
  struct Declared {
    std::string name;
    DType type;
    std::vector<uint64_t> shape;
    uint64_t n_bytes = 0;
    uint64_t offset = 0;  // relative to the data section
    uint64_t written = 0;
  };

  void emit(const void* data, size_t n);
  void emit_u32(uint32_t v) { emit(&v, sizeof v); }
  void emit_u64(uint64_t v) { emit(&v, sizeof v); }
  void emit_string(std::string_view s);
  void emit_value(std::string_view key, const Value& value, uint32_t depth);
  void pad_to(uint64_t target_pos);
  void check_open(std::string_view what) const;
  [[noreturn]] void write_failed(int err);

  std::string path_;
  std::FILE* file_ = nullptr;
  std::vector<uint8_t>* memory_ = nullptr;
  std::span<uint8_t> buffer_;  // the fixed-size target, when not a file or a vector
  uint64_t alignment_;
  bool alignment_in_metadata_ = false;
  bool header_written_ = false;
  bool finished_ = false;
  uint64_t pos_ = 0;         // bytes emitted so far
  uint64_t data_start_ = 0;  // file offset of the data section
  uint64_t data_end_ = 0;    // end of the last declared tensor, relative to the data section
  size_t current_ = 0;       // tensor being filled
  std::vector<std::pair<std::string, Value>> metadata_;
  std::unordered_map<std::string, size_t> metadata_index_;
  std::vector<Declared> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

// A whole small file at once (tests, fixtures, seed corpora).
struct TensorToWrite {
  std::string name;
  DType type = DType::F32;
  std::vector<uint64_t> shape;
  std::span<const uint8_t> data;
};
void write_gguf(const std::string& path, const std::vector<std::pair<std::string, Value>>& metadata,
                std::span<const TensorToWrite> tensors, uint64_t alignment = kDefaultAlignment);
std::vector<uint8_t> write_gguf_to_memory(
    const std::vector<std::pair<std::string, Value>>& metadata,
    std::span<const TensorToWrite> tensors, uint64_t alignment = kDefaultAlignment);

}  // namespace tandem::gguf

#pragma once
// Binds GGUF tensors to an architecture's weight fields: one call per tensor that checks the
// name, shape and format, says expected vs found, and returns a view the backend can use
// (in place from the mmap on the CPU; uploaded for devices with their own memory).
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/backend.h"

namespace tandem {
namespace gguf {
class GgufFile;
struct TensorInfo;
}  // namespace gguf

class WeightBinder {
 public:
  // Weights go to `backend` unless a call names another device.
  WeightBinder(const gguf::GgufFile& file, Backend& backend);

  bool has(std::string_view name) const;
  // A matrix or a stack of matrices for matmul-style ops; `shape` in GGUF order
  // (shape[0] = row length). Any format the backend multiplies with.
  WeightView matrix(std::string_view name, std::initializer_list<int64_t> shape);
  WeightView matrix(std::string_view name, std::initializer_list<int64_t> shape, Backend& on);
  // Some matrices of a stack (the experts of a layer that live on `on`), packed in the order
  // of `indices`; matrix i of the result is matrix indices[i] of the tensor.
  WeightView matrices(std::string_view name, std::initializer_list<int64_t> shape,
                      std::span<const int32_t> indices, Backend& on);
  // A vector or small matrix needed as F32 values (norm weights, router, expert bias):
  // converted to F32 once if stored otherwise.
  const float* f32(std::string_view name, std::initializer_list<int64_t> shape);
  const float* f32(std::string_view name, std::initializer_list<int64_t> shape, Backend& on);
  // A weight built at load time (e.g. a transposed projection), stored as `type` (F32 or a
  // format quantize_row writes), kept alive by the binder.
  WeightView owned(const std::vector<float>& values, DType type, int64_t cols, int64_t rows,
                   int64_t n_mats, const std::string& what, Backend& on);
  // The tensor's info after the same checks, for code that must rework a weight at load time.
  const gguf::TensorInfo& info(std::string_view name, std::initializer_list<int64_t> shape);

  uint64_t bound_bytes() const { return bound_bytes_; }
  const gguf::GgufFile& file() const { return file_; }

  // Every tensor the model reads, once each: used in place from the file's mapping (its pages
  // are read from disk when first touched), or read whole at load (copied to a device,
  // converted, or reworked). What prefetching and the cold-start count work from.
  struct Bound {
    const gguf::TensorInfo* tensor;
    bool in_place;
  };
  const std::vector<Bound>& bound() const { return bound_; }

 private:
  const gguf::TensorInfo& checked(std::string_view name, std::initializer_list<int64_t> shape) const;
  void note_bound(const gguf::TensorInfo& tensor, bool in_place);
  const void* device_pointer(const void* host, size_t bytes, const std::string& what, Backend& on);

  const gguf::GgufFile& file_;
  Backend& backend_;
  std::vector<std::shared_ptr<DeviceBuffer>> owned_;
  std::vector<std::vector<float>> converted_;
  std::vector<std::vector<uint8_t>> converted_bytes_;
  uint64_t bound_bytes_ = 0;
  std::vector<Bound> bound_;
};

}  // namespace tandem

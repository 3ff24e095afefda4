#pragma once
// Binds GGUF tensors to an architecture's weight fields: one call per tensor that checks the
// name, shape and format, says expected vs found, and returns a view the backend can use
// (in place from the mmap on the CPU; uploaded for devices with their own memory). Uploads are
// queued and run by finish_uploads(): every device at once, one thread each, with progress.
#include <exception>
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
  // Rows [first, first + n) of a matrix (a layer's heads of a projection whose rows go by head):
  // in place on the host. Interleaved formats: whole groups of 16 rows only.
  WeightView rows(std::string_view name, std::initializer_list<int64_t> shape, int64_t first,
                  int64_t n, Backend& on);
  // Columns [first, first + n) of every row of a matrix (the heads' part of an output
  // projection), copied at load; both must be whole blocks of its format (the message says so).
  WeightView columns(std::string_view name, std::initializer_list<int64_t> shape, int64_t first,
                     int64_t n, Backend& on);
  // A vector or small matrix needed as F32 values (norm weights, router, expert bias):
  // converted to F32 once if stored otherwise.
  const float* f32(std::string_view name, std::initializer_list<int64_t> shape);
  const float* f32(std::string_view name, std::initializer_list<int64_t> shape, Backend& on);
  // Some rows of a matrix as F32 values, packed in the order of `indices` (the per-expert biases
  // of the experts that live on `on`): row i of the result is row indices[i] of the tensor.
  const float* f32_rows(std::string_view name, std::initializer_list<int64_t> shape,
                        std::span<const int32_t> indices, Backend& on);
  // A weight built at load time (e.g. a transposed projection), stored as `type` (F32 or a
  // format quantize_row writes), kept alive by the binder.
  WeightView owned(const std::vector<float>& values, DType type, int64_t cols, int64_t rows,
                   int64_t n_mats, const std::string& what, Backend& on);
  // The tensor's info after the same checks, for code that must rework a weight at load time.
  const gguf::TensorInfo& info(std::string_view name, std::initializer_list<int64_t> shape);

  // Copies every queued weight to its device: one thread per device, all at the same time,
  // each reading the mapped file (its pages come from disk as they are needed, while the other
  // devices' copies go on) into that device's staging. A progress line with bytes/s when
  // `show_progress` and the total is large. Views returned before are valid once it returns.
  void finish_uploads(bool show_progress);

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
  // A copy from the mapped file to a device, queued for finish_uploads().
  struct Upload {
    Backend* on;
    void* dst;
    const void* src;
    size_t bytes;
  };
  const gguf::TensorInfo& checked(std::string_view name, std::initializer_list<int64_t> shape) const;
  void note_bound(const gguf::TensorInfo& tensor, bool in_place);
  // The weights' address on `on`: `host` itself for host-memory devices, else device memory
  // whose upload is queued; `made` (if not empty) are bytes built at load that hold `host`:
  // those are copied at once and released.
  const void* device_pointer(const void* host, size_t bytes, const std::string& what, Backend& on,
                             std::vector<uint8_t>* made = nullptr);
  // The matrices of a view in a format `on` multiplies: an interleaved format (`tandem repack`,
  // CPU-only) taken apart into its base format's rows for a device without its kernels.
  WeightView for_device(WeightView view, const std::string& what, Backend& on, std::vector<uint8_t>& made);
  // A view of the file's bytes made usable on `on`: for_device(), then in place on the host or
  // queued for upload (device_pointer).
  WeightView place(WeightView view, const std::string& what, Backend& on);

  const gguf::GgufFile& file_;
  Backend& backend_;
  std::vector<std::shared_ptr<DeviceBuffer>> owned_;
  std::vector<std::vector<float>> converted_;
  std::vector<std::vector<uint8_t>> converted_bytes_;
  uint64_t bound_bytes_ = 0;
  std::vector<Bound> bound_;
  std::vector<Upload> uploads_;
  std::exception_ptr upload_error_;  // an upload failed: the device's weights are incomplete
  bool told_taken_apart_ = false;
};

}  // namespace tandem

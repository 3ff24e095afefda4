#pragma once
// Heap memory aligned for the widest SIMD loads (64 bytes), owned like a unique_ptr; large
// buffers on huge pages.
#include <cstddef>
#include <cstdint>
#include <memory>

namespace tandem {

constexpr size_t kBufferAlignment = 64;
// Buffers of at least this size start on a 2 MiB boundary and ask for transparent huge pages.
constexpr size_t kHugePageBytes = size_t(2) << 20;

struct AlignedFree {
  void operator()(void* p) const noexcept;
};

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes);

  uint8_t* data() { return data_.get(); }
  const uint8_t* data() const { return data_.get(); }
  size_t size() const { return size_; }
  template <class T>
  T* as() { return reinterpret_cast<T*>(data_.get()); }
  template <class T>
  const T* as() const { return reinterpret_cast<const T*>(data_.get()); }

 private:
  std::unique_ptr<uint8_t, AlignedFree> data_;
  size_t size_ = 0;
};

}  // namespace tandem

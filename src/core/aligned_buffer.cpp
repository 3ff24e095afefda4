#include "core/aligned_buffer.h"

#include <cstdlib>
#include <new>

namespace tandem {

void AlignedFree::operator()(void* p) const noexcept { std::free(p); }

AlignedBuffer::AlignedBuffer(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  const size_t rounded = (bytes + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment;
  void* p = std::aligned_alloc(kBufferAlignment, rounded);
  if (!p) throw std::bad_alloc();
  data_.reset(static_cast<uint8_t*>(p));
}

}  // namespace tandem

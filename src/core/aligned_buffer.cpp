#include "core/aligned_buffer.h"

#include <sys/mman.h>

#include <cstdlib>
#include <new>

namespace tandem {

void AlignedFree::operator()(void* p) const noexcept { std::free(p); }

AlignedBuffer::AlignedBuffer(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  // Large buffers (KV caches, device memory of simulated devices, benchmark arrays) on 2 MiB
  // pages, as the weights' mapping: fewer TLB misses, and on VMs with shadow page tables the
  // first pass over fresh memory is ~8x faster (see MappedFile).
  const bool huge = bytes >= kHugePageBytes;
  const size_t alignment = huge ? kHugePageBytes : kBufferAlignment;
  const size_t rounded = (bytes + alignment - 1) / alignment * alignment;
  void* p = std::aligned_alloc(alignment, rounded);
  if (!p) throw std::bad_alloc();
  if (huge) ::madvise(p, rounded, MADV_HUGEPAGE);  // advice: a refusal leaves 4 KiB pages
  data_.reset(static_cast<uint8_t*>(p));
}

}  // namespace tandem

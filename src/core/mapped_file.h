#pragma once
// A read-only memory map of a whole file. Weights resident on the CPU are used in place from
// this map (zero copy: loading a model costs page faults, not reads).
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

namespace tandem {

class MappedFile {
 public:
  // Maps `path` read-only; throws tandem::Error naming the file and the system's reason.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;

  const std::string& path() const { return path_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

  // Locks bytes [offset, offset + bytes) of the map in RAM (mlock), reading any page not yet in
  // memory, so the kernel can never evict it. Returns the system's reason on failure (often the
  // RLIMIT_MEMLOCK limit), empty on success.
  std::string lock_in_memory(size_t offset, size_t bytes) const;

  // Enters into this process's page tables every part of the file that the page cache already
  // holds, and nothing else: no disk read. Without it each first touch of a weight costs a page
  // fault per 64 KiB, which on a VM is several microseconds; a decode step touches ~1.5 GiB of
  // new experts, so its first tokens ran at half speed (measured: 13% of decode time in page
  // faults). Takes ~0.15 s for 10 GiB of cached file. Returns the bytes mapped; 0 where the
  // kernel lacks MADV_POPULATE_READ (Linux < 5.14).
  size_t map_cached_pages() const;

  // Reads of weights go by 2 MiB pieces aligned in the file: the large pages the mapping asks
  // for (see the constructor), so that read-ahead and page tables use whole large pages.
  static constexpr size_t kReadGranule = size_t(2) << 20;

  // Reads the 2 MiB pieces covering [offset, offset + bytes) into the page cache if needed and
  // enters them into the page tables (MADV_POPULATE_READ, or a touch per page on older
  // kernels); returns when all of them are in memory. On a kernel with large file folios the
  // pieces come in as 2 MiB pages (see core/background_reader.h for why not MADV_WILLNEED).
  void read_into_memory(size_t offset, size_t bytes) const;
  // Bytes of [offset, offset + bytes) in the page cache now (mincore), counted by whole pages;
  // fully_cached: every page of it is.
  size_t cached_bytes(size_t offset, size_t bytes) const;
  bool fully_cached(size_t offset, size_t bytes) const;
  // Bytes of this mapping that the page tables map with 2 MiB entries now (FilePmdMapped in
  // /proc/self/smaps); 0 where the kernel does not say.
  size_t huge_mapped_bytes() const;

 private:
  // The 2 MiB pieces covering [offset, offset + bytes), clamped to the file: {start, length}.
  std::pair<size_t, size_t> granules(size_t offset, size_t bytes) const;

  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Drops the clean cached pages of the file at `path` from the page cache
// (POSIX_FADV_DONTNEED), as if it had never been read: what a cold start sees. Pages that a
// process still maps stay. Returns the bytes of the file still cached afterwards.
size_t evict_from_page_cache(const std::string& path);

// The same for a file just written (written back first, so its pages are clean), best effort (a
// file system that cannot drop pages keeps them; nothing fails): its first mapping then reads it
// back in 2 MiB pages instead of mapping the small pieces write() cached, 4 KiB at a time
// (docs/performance.md: 15-20% slower to stream on a VM).
void drop_written_pages(const std::string& path);

}  // namespace tandem

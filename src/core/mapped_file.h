#pragma once
// A read-only memory map of a whole file. Weights resident on the CPU are used in place from
// this map (zero copy: loading a model costs page faults, not reads).
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

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

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace tandem

#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <utility>
#include <vector>

#include "core/error.h"

namespace tandem {

MappedFile::MappedFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st{};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail("{}: cannot stat: {}", path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{}: not a regular file", path);
  }
  size_ = size_t(st.st_size);
  if (size_ > 0) {
    void* map = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      fail("{}: cannot mmap {} bytes: {}", path, size_, std::strerror(err));
    }
    data_ = static_cast<const uint8_t*>(map);
    // Weights are streamed whole, so ask for 2 MiB pages: where the filesystem caches large
    // folios (ext4 and xfs on Linux >= 6.x), disk reads become 2 MiB reads and the page tables
    // hold 512x fewer entries. Measured on this project's VM (shadow paging): a process's first
    // pass over cached weights ran at 3 GB/s with 4 KiB pages and 25 GB/s with 2 MiB pages, so
    // decode no longer warms up over its first ~40 tokens; cold reads went from 1.5-3 to
    // 6 GB/s. Advice only: kernels without file THP ignore it.
    ::madvise(map, size_, MADV_HUGEPAGE);
  }
  ::close(fd);  // the mapping keeps the file alive
}

std::string MappedFile::lock_in_memory(size_t offset, size_t bytes) const {
  TANDEM_CHECK(offset <= size_ && bytes <= size_ - offset);
  if (bytes == 0) return {};
  // mlock wants a page-aligned start.
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  const size_t start = offset / page * page;
  if (::mlock(data_ + start, offset + bytes - start) != 0) return std::strerror(errno);
  return {};
}

size_t MappedFile::map_cached_pages() const {
#ifdef MADV_POPULATE_READ
  // 2 MiB windows: a run of fully cached windows is populated with one madvise() (a partly
  // cached window is left to faults, so that populating never reads from disk).
  size_t mapped = 0, run_start = 0, run_bytes = 0;
  auto flush = [&]() -> bool {
    if (run_bytes == 0) return true;
    if (::madvise(const_cast<uint8_t*>(data_) + run_start, run_bytes, MADV_POPULATE_READ) != 0)
      return false;  // EINVAL on an old kernel: give up, faults still work
    mapped += run_bytes;
    run_bytes = 0;
    return true;
  };
  for (size_t offset = 0; offset < size_; offset += kReadGranule) {
    const size_t bytes = std::min(kReadGranule, size_ - offset);
    if (fully_cached(offset, bytes)) {
      if (run_bytes == 0) run_start = offset;
      run_bytes += bytes;
    } else if (!flush()) {
      return mapped;
    }
  }
  flush();
  return mapped;
#else
  return 0;
#endif
}

std::pair<size_t, size_t> MappedFile::granules(size_t offset, size_t bytes) const {
  TANDEM_CHECK(offset <= size_ && bytes <= size_ - offset);
  const size_t start = offset / kReadGranule * kReadGranule;
  const size_t end = std::min(size_, (offset + bytes + kReadGranule - 1) / kReadGranule * kReadGranule);
  return {start, end - start};
}

void MappedFile::read_into_memory(size_t offset, size_t bytes) const {
  const auto [start, length] = granules(offset, bytes);
  if (length == 0) return;
#ifdef MADV_POPULATE_READ
  if (::madvise(const_cast<uint8_t*>(data_) + start, length, MADV_POPULATE_READ) == 0) return;
#endif
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  volatile uint8_t sink = 0;
  for (size_t at = start; at < start + length; at += page) sink = sink + data_[at];
}

bool MappedFile::fully_cached(size_t offset, size_t bytes) const {
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  const size_t start = offset / page * page, end = (offset + bytes + page - 1) / page * page;
  return cached_bytes(offset, bytes) == end - start;
}

size_t MappedFile::cached_bytes(size_t offset, size_t bytes) const {
  TANDEM_CHECK(offset <= size_ && bytes <= size_ - offset);
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  const size_t start = offset / page * page, end = offset + bytes;
  constexpr size_t kWindow = size_t(64) << 20;  // one mincore() call per 64 MiB
  std::vector<unsigned char> resident((std::min(kWindow, end - start) + page - 1) / page);
  size_t cached = 0;
  for (size_t at = start; at < end; at += kWindow) {
    const size_t window = std::min(kWindow, end - at);
    if (::mincore(const_cast<uint8_t*>(data_) + at, window, resident.data()) != 0) continue;
    for (size_t i = 0; i < (window + page - 1) / page; ++i) cached += (resident[i] & 1) ? page : 0;
  }
  return cached;
}

size_t MappedFile::huge_mapped_bytes() const {
  if (!data_) return 0;
  // Each mapping's block starts with "start-end perms ..." in hex; its fields follow.
  std::ifstream smaps("/proc/self/smaps");
  const std::string start = fmt::format("{:x}-", reinterpret_cast<uintptr_t>(data_));
  auto is_header = [](const std::string& line) {  // "7f00a000-7f10b000 r--s ..."
    const size_t space = line.find(' ');
    if (space == std::string::npos || space == 0) return false;
    for (size_t i = 0; i < space; ++i)
      if (!std::isxdigit(static_cast<unsigned char>(line[i])) && line[i] != '-') return false;
    return true;
  };
  std::string line;
  bool ours = false;
  while (std::getline(smaps, line)) {
    if (is_header(line))
      ours = line.rfind(start, 0) == 0;
    else if (ours && line.rfind("FilePmdMapped:", 0) == 0)
      return size_t(std::strtoull(line.c_str() + 14, nullptr, 10)) * 1024;  // in kB
  }
  return 0;
}

size_t evict_from_page_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot open: {}", path, std::strerror(errno));
  const int err = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  if (err != 0) fail("{}: cannot drop it from the page cache: {}", path, std::strerror(err));
  const MappedFile map(path);
  return map.cached_bytes(0, map.size());
}

void drop_written_pages(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

}  // namespace tandem

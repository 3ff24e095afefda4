#pragma once
// A thread that asks the kernel to read parts of mapped files into the page cache, so that the
// threads that compute never wait to submit disk reads: MADV_WILLNEED returns only once its
// reads are queued, and blocks while the device's queue is full (measured on a cold start of
// the lite model: 8-20 ms per MoE layer on the computing thread). Reads marked urgent (what the
// current step needs) go before those that are not (guesses, weights of later layers).
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <thread>

#include "core/mapped_file.h"

namespace tandem {

class BackgroundReader {
 public:
  BackgroundReader();
  // Stops after the read in progress; reads still queued are dropped (they were only advice).
  ~BackgroundReader();
  BackgroundReader(const BackgroundReader&) = delete;
  BackgroundReader& operator=(const BackgroundReader&) = delete;

  // MappedFile::start_reading(offset, bytes) on the reader's thread; `map` must outlive it.
  void start_reading(const MappedFile& map, size_t offset, size_t bytes, bool urgent);

 private:
  struct Read {
    const MappedFile* map;
    size_t offset, bytes;
  };
  void run();

  static constexpr size_t kPieceBytes = size_t(16) << 20;

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Read> urgent_, later_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace tandem

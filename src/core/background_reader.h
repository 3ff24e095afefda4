#pragma once
// A thread that reads parts of mapped files into the page cache and the page tables ahead of
// use (MappedFile::read_into_memory), so that the threads that compute find weights in memory
// instead of faulting them in. Reads marked urgent (what the current step needs) go before those
// that are not (guesses, weights of later layers).
//
// Why a populating thread and not MADV_WILLNEED advice: measured on this project's VM (Linux
// 6.18, ext4), the advice blocked the computing thread 8-20 ms per MoE layer, a range advised
// 2 s earlier still took 0.5 s to populate, and the page faults that did the reading left the
// cache in 4 KiB pieces (0.13 of 3.8 GiB on 2 MiB pages after a cold start). Populating reads
// 2 MiB folios at 4-5 GB/s and maps them: a cold start's first token went from 1.3-1.7 s to
// 0.8-0.95 s (lite, 1-token prompt), and decode afterwards runs at its warm speed.
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

  // MappedFile::read_into_memory(offset, bytes) on the reader's thread; `map` must outlive it.
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

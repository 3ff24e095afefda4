#pragma once
// Threads that read parts of mapped files into the page cache and the page tables ahead of
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
#include <vector>

#include "core/mapped_file.h"

namespace tandem {

class BackgroundReader {
 public:
  BackgroundReader();
  // Stops after the read in progress; reads still queued are dropped (they were only advice).
  ~BackgroundReader();
  BackgroundReader(const BackgroundReader&) = delete;
  BackgroundReader& operator=(const BackgroundReader&) = delete;

  // MappedFile::read_into_memory(offset, bytes) on a reader thread; `map` must outlive it.
  void start_reading(const MappedFile& map, size_t offset, size_t bytes, bool urgent);
  // Blocks until every read started so far is done.
  void wait_until_done();

  // Reads run on this many threads, a piece of at most kPieceBytes at a time: several requests
  // in flight read scattered experts faster than one (measured on this project's VM: 2 MiB
  // pieces 2.5 GB/s on one thread, 4.0 on four; a cold start's first token 0.70-0.93 s on one
  // thread and 0.64-0.66 s on four, lite model, 1-token prompt), and reading is I/O waiting, not
  // computing.
  static constexpr int kThreads = 4;
  static constexpr size_t kPieceBytes = size_t(16) << 20;

 private:
  struct Read {
    const MappedFile* map;
    size_t offset, bytes;
  };
  void run();

  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::deque<Read> urgent_, later_;
  int reading_ = 0;  // pieces being read now
  bool stopping_ = false;
  std::vector<std::thread> threads_;  // last: start once the members above exist
};

}  // namespace tandem

#include "core/background_reader.h"

#include <algorithm>

namespace tandem {

BackgroundReader::BackgroundReader() {
  for (int i = 0; i < kThreads; ++i) threads_.emplace_back([this] { run(); });
}

BackgroundReader::~BackgroundReader() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& thread : threads_) thread.join();
}

void BackgroundReader::start_reading(const MappedFile& map, size_t offset, size_t bytes, bool urgent) {
  {
    std::lock_guard lock(mutex_);
    (urgent ? urgent_ : later_).push_back({&map, offset, bytes});
  }
  wake_.notify_one();
}

void BackgroundReader::wait_until_done() {
  std::unique_lock lock(mutex_);
  done_.wait(lock, [&] { return urgent_.empty() && later_.empty() && reading_ == 0; });
}

void BackgroundReader::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stopping_ || !urgent_.empty() || !later_.empty(); });
    if (stopping_) return;
    // A piece at a time, so that an urgent read waits for at most one piece of a large one.
    std::deque<Read>& queue = urgent_.empty() ? later_ : urgent_;
    Read& front = queue.front();
    const Read piece = {front.map, front.offset, std::min(front.bytes, kPieceBytes)};
    front.offset += piece.bytes;
    front.bytes -= piece.bytes;
    if (front.bytes == 0) queue.pop_front();
    ++reading_;
    lock.unlock();
    piece.map->read_into_memory(piece.offset, piece.bytes);
    lock.lock();
    if (--reading_ == 0 && urgent_.empty() && later_.empty()) done_.notify_all();
  }
}

}  // namespace tandem

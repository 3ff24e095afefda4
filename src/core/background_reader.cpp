#include "core/background_reader.h"

#include <algorithm>

namespace tandem {

BackgroundReader::BackgroundReader() : thread_([this] { run(); }) {}

BackgroundReader::~BackgroundReader() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

void BackgroundReader::start_reading(const MappedFile& map, size_t offset, size_t bytes, bool urgent) {
  {
    std::lock_guard lock(mutex_);
    (urgent ? urgent_ : later_).push_back({&map, offset, bytes});
  }
  wake_.notify_one();
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
    lock.unlock();
    piece.map->read_into_memory(piece.offset, piece.bytes);
    lock.lock();
  }
}

}  // namespace tandem

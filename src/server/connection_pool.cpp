#include "server/connection_pool.h"

#include <chrono>
#include <system_error>
#include <thread>

namespace tandem::server {

ConnectionPool::ConnectionPool(size_t max_threads, int idle_seconds)
    : max_threads_(std::max<size_t>(1, max_threads)), idle_seconds_(idle_seconds) {}

ConnectionPool::~ConnectionPool() {
  shutdown();
}

void ConnectionPool::enqueue(std::function<void()> task) {
  std::lock_guard lock(mutex_);
  tasks_.push_back(std::move(task));
  // A new thread only when no thread is waiting for work: those waiting take it.
  if (idle_ < tasks_.size() && threads_ < max_threads_) {
    ++threads_;
    try {
      std::thread([this] { work(); }).detach();
      return;
    } catch (const std::system_error&) {
      --threads_;  // out of threads (ulimit -u): the task waits for a running one
    }
  }
  work_.notify_one();
}

void ConnectionPool::work() {
  std::unique_lock lock(mutex_);
  for (;;) {
    ++idle_;
    const bool woken = work_.wait_for(lock, std::chrono::seconds(idle_seconds_),
                                      [&] { return stopping_ || !tasks_.empty(); });
    --idle_;
    if (tasks_.empty() && (stopping_ || !woken)) break;
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    task();
    lock.lock();
  }
  // The last thing this thread touches is the pool's state, under the lock: shutdown() (and the
  // destructor) wait for threads_ to reach 0 before the pool goes away.
  --threads_;
  ended_.notify_all();
}

void ConnectionPool::shutdown() {
  std::unique_lock lock(mutex_);
  stopping_ = true;
  work_.notify_all();
  ended_.wait(lock, [&] { return threads_ == 0; });
}

size_t ConnectionPool::threads() const {
  std::lock_guard lock(mutex_);
  return threads_;
}

}  // namespace tandem::server

#pragma once
// The threads that read and answer connections. cpp-httplib gives every accepted connection a
// task that holds a thread while it waits for the request, and its own pool has a fixed number of
// threads: 300 clients that connect and send nothing held all of them for the read timeout and a
// real request queued behind them for tens of seconds. This pool grows on demand up to
// `max_threads` (a connection beyond that waits for a free thread) and lets threads idle for
// `idle_seconds` go, so idle or slow clients cost a blocked thread each, not other clients' time.
#include <httplib.h>

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>

namespace tandem::server {

class ConnectionPool : public httplib::TaskQueue {
 public:
  explicit ConnectionPool(size_t max_threads, int idle_seconds = 30);
  ~ConnectionPool() override;

  void enqueue(std::function<void()> task) override;
  // Runs what is queued, then returns once every thread has ended.
  void shutdown() override;

  size_t threads() const;  // running now (tests)

 private:
  void work();

  const size_t max_threads_;
  const int idle_seconds_;
  mutable std::mutex mutex_;
  std::condition_variable work_, ended_;
  std::deque<std::function<void()>> tasks_;
  size_t threads_ = 0, idle_ = 0;
  bool stopping_ = false;
};

}  // namespace tandem::server

#pragma once
// A persistent pool of worker threads for data-parallel kernels. The calling thread takes part.
// Dispatch is lock-free: a job is published with one atomic generation bump; workers claim
// task indices with fetch_add; waiting is a short spin, then a futex sleep (std::atomic::wait).
#include <atomic>
#include <cstdint>
#include <thread>
#include <type_traits>
#include <vector>

namespace tandem {

// Physical cores (hyper-threads of one core counted once); the default for --threads.
int physical_core_count();

// Logical CPUs this process may run on, one per physical core (the first of each core's
// hyper-threads), in CPU order: where pinned pool threads go.
std::vector<int> one_cpu_per_core();

class ThreadPool {
 public:
  // `n_threads` counts the caller: ThreadPool(1) runs everything inline. With `pin`, worker t
  // is bound to its own physical core (one_cpu_per_core()[t], t >= 1), so the OS does not move
  // a kernel's threads between cores mid-job or stack two on one core's hyper-threads; there is
  // no pinning when there are more threads than cores. The caller (thread 0) is left free: it
  // is someone else's thread, and binding it would follow it into all its later work (a pinned
  // caller made `bench`'s later measurements run two threads on one core).
  explicit ThreadPool(int n_threads, bool pin = false);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }

  // Calls fn(task, thread) for every task in [0, n_tasks), spread over all threads, and returns
  // when all are done. `thread` is in [0, size()), for per-thread scratch. Not reentrant.
  template <class Fn>
  void parallel_for(int64_t n_tasks, Fn&& fn) {
    using F = std::remove_reference_t<Fn>;
    run(n_tasks, [](void* ctx, int64_t task, int thread) { (*static_cast<F*>(ctx))(task, thread); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

 private:
  using TaskFn = void (*)(void* ctx, int64_t task, int thread);
  void run(int64_t n_tasks, TaskFn fn, void* ctx);
  void worker_loop(int thread);
  void drain(int thread);

  std::vector<std::thread> workers_;
  // The current job; written by the caller before `generation_` is bumped (release).
  TaskFn job_fn_ = nullptr;
  void* job_ctx_ = nullptr;
  int64_t job_tasks_ = 0;
  alignas(64) std::atomic<int64_t> next_task_{0};
  alignas(64) std::atomic<uint32_t> generation_{0};
  alignas(64) std::atomic<int> busy_workers_{0};
  std::atomic<bool> stopping_{false};
};

}  // namespace tandem

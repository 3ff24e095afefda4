#include "core/thread_pool.h"

#include <immintrin.h>
#include <pthread.h>
#include <sched.h>

#include <fstream>
#include <set>
#include <string>
#include <utility>

#include "core/error.h"

namespace tandem {
namespace {

// About 50 µs of spinning before sleeping: long enough to catch the next layer's job during a
// forward pass, short enough not to burn a core while idle.
constexpr int kSpinIterations = 20000;

template <class T>
void spin_then_wait(const std::atomic<T>& value, T old) {
  for (int i = 0; i < kSpinIterations; ++i) {
    if (value.load(std::memory_order_acquire) != old) return;
    _mm_pause();
  }
  value.wait(old, std::memory_order_acquire);
}

}  // namespace

int physical_core_count() {
  std::set<std::pair<std::string, std::string>> cores;
  const unsigned logical = std::thread::hardware_concurrency();
  for (unsigned cpu = 0; cpu < logical; ++cpu) {
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    std::ifstream package(dir + "physical_package_id"), core(dir + "core_id");
    std::string package_id, core_id;
    if (!(package >> package_id) || !(core >> core_id)) return logical > 0 ? int(logical) : 1;
    cores.emplace(package_id, core_id);
  }
  return cores.empty() ? 1 : int(cores.size());
}

std::vector<int> one_cpu_per_core() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return {};
  std::set<std::pair<std::string, std::string>> seen;
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    std::ifstream package(dir + "physical_package_id"), core(dir + "core_id");
    std::string package_id, core_id;
    // Without topology (some containers) every CPU counts as its own core.
    const bool known = (package >> package_id) && (core >> core_id);
    if (!known || seen.emplace(std::move(package_id), std::move(core_id)).second) cpus.push_back(cpu);
  }
  return cpus;
}

namespace {

void pin_this_thread(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);  // best effort: a refusal is harmless
}

}  // namespace

ThreadPool::ThreadPool(int n_threads, bool pin) {
  if (n_threads < 1) fail("--threads must be at least 1 (got {})", n_threads);
  std::vector<int> cpus;
  if (pin) {
    cpus = one_cpu_per_core();
    if (int(cpus.size()) < n_threads) cpus.clear();  // oversubscribed: let the OS place them
  }
  workers_.reserve(size_t(n_threads - 1));
  for (int t = 1; t < n_threads; ++t) {
    const int cpu = cpus.empty() ? -1 : cpus[size_t(t)];
    workers_.emplace_back([this, t, cpu] {
      if (cpu >= 0) pin_this_thread(cpu);
      worker_loop(t);
    });
  }
}

ThreadPool::~ThreadPool() {
  stopping_.store(true, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

void ThreadPool::drain(int thread) {
  for (;;) {
    const int64_t task = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (task >= job_tasks_) return;
    job_fn_(job_ctx_, task, thread);
  }
}

void ThreadPool::run(int64_t n_tasks, TaskFn fn, void* ctx) {
  if (n_tasks <= 0) return;
  if (workers_.empty() || n_tasks == 1) {
    for (int64_t task = 0; task < n_tasks; ++task) fn(ctx, task, 0);
    return;
  }
  job_fn_ = fn;
  job_ctx_ = ctx;
  job_tasks_ = n_tasks;
  next_task_.store(0, std::memory_order_relaxed);
  busy_workers_.store(int(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  drain(0);
  // Wait until every worker has left the job, so that fn/ctx may go out of scope.
  for (int busy = busy_workers_.load(std::memory_order_acquire); busy != 0;
       busy = busy_workers_.load(std::memory_order_acquire))
    spin_then_wait(busy_workers_, busy);
}

void ThreadPool::worker_loop(int thread) {
  uint32_t seen = 0;
  for (;;) {
    spin_then_wait(generation_, seen);
    const uint32_t now = generation_.load(std::memory_order_acquire);
    if (now == seen) continue;
    seen = now;
    if (stopping_.load(std::memory_order_relaxed)) return;
    drain(thread);
    if (busy_workers_.fetch_sub(1, std::memory_order_acq_rel) == 1) busy_workers_.notify_one();
  }
}

}  // namespace tandem

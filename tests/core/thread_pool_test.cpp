#include "core/thread_pool.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <thread>

#include <atomic>
#include <vector>

namespace tandem {
namespace {

TEST(ThreadPool, EveryTaskRunsExactlyOnce) {
  ThreadPool pool(3);
  for (int round = 0; round < 200; ++round) {
    const int n_tasks = 1 + round * 7 % 97;
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n_tasks));
    pool.parallel_for(n_tasks, [&](int64_t task, int thread) {
      EXPECT_GE(thread, 0);
      EXPECT_LT(thread, pool.size());
      hits[size_t(task)].fetch_add(1);
    });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  }
}

TEST(ThreadPool, SingleThreadRunsInline) {
  ThreadPool pool(1);
  int sum = 0;  // no atomics needed: everything runs on the caller
  pool.parallel_for(10, [&](int64_t task, int thread) {
    EXPECT_EQ(thread, 0);
    sum += int(task);
  });
  EXPECT_EQ(sum, 45);
}

TEST(ThreadPool, RejectsZeroThreads) { EXPECT_ANY_THROW(ThreadPool pool(0)); }

TEST(ThreadPool, PhysicalCoreCountIsPositive) { EXPECT_GE(physical_core_count(), 1); }

// With pinning, each worker runs on one CPU of its own (when the process has a core per
// thread); the caller keeps its affinity.
TEST(ThreadPool, PinnedWorkersEachRunOnTheirOwnCore) {
  const std::vector<int> cores = one_cpu_per_core();
  ASSERT_FALSE(cores.empty());
  if (cores.size() < 2) GTEST_SKIP() << "one core: nothing to pin";
  cpu_set_t before;
  CPU_ZERO(&before);
  ASSERT_EQ(sched_getaffinity(0, sizeof before, &before), 0);
  std::vector<int> allowed_cpus(2, -1), only_cpu(2, -1);
  {
    ThreadPool pool(2, /*pin=*/true);
    std::atomic<int> arrived{0};
    pool.parallel_for(2, [&](int64_t, int thread) {
      // Hold both threads in the job until both have arrived, so each takes one task.
      ++arrived;
      while (arrived.load() < 2) std::this_thread::yield();
      cpu_set_t set;
      CPU_ZERO(&set);
      ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
      allowed_cpus[size_t(thread)] = CPU_COUNT(&set);
      for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
        if (CPU_ISSET(cpu, &set)) only_cpu[size_t(thread)] = cpu;
    });
  }
  EXPECT_EQ(allowed_cpus[1], 1);
  EXPECT_EQ(only_cpu[1], cores[1]);
  EXPECT_EQ(allowed_cpus[0], CPU_COUNT(&before)) << "the caller must keep its affinity";
}

}  // namespace
}  // namespace tandem

#include "core/thread_pool.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace tandem

#include "base/thread_pool.h"

#include <atomic>
#include <vector>

#include "absl/synchronization/blocking_counter.h"
#include "gtest/gtest.h"

namespace gcomp {
namespace {

TEST(ThreadPool, ParallelForRunsEveryIndexOnce) {
  for (int threads : {0, 1, 3}) {
    ThreadPool pool(threads);
    std::vector<std::atomic<int>> hits(1000);
    pool.ParallelFor(hits.size(), [&](size_t i) { hits[i]++; });
    for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  }
}

TEST(ThreadPool, ScheduleRunsEveryClosureBeforeDestruction) {
  std::atomic<int> count{0};
  {
    ThreadPool pool(2);
    for (int i = 0; i < 100; ++i) pool.Schedule([&] { count++; });
  }
  EXPECT_EQ(count.load(), 100);
}

TEST(ThreadPool, NestedParallelForDoesNotDeadlock) {
  ThreadPool pool(2);
  std::atomic<int> count{0};
  pool.ParallelFor(4, [&](size_t) { pool.ParallelFor(10, [&](size_t) { count++; }); });
  EXPECT_EQ(count.load(), 40);
}

TEST(ThreadPool, HardwareThreadsIsPositive) { EXPECT_GE(ThreadPool::HardwareThreads(), 1); }

}  // namespace
}  // namespace gcomp

#include "server/thread_pool.h"

#include <atomic>

#include "gtest/gtest.h"

namespace gcomp::server {
namespace {

TEST(ThreadPool, RunsEverythingScheduledBeforeDestruction) {
  std::atomic<int> count{0};
  {
    ThreadPool pool(3);
    for (int i = 0; i < 100; ++i) pool.Schedule([&] { ++count; });
  }
  EXPECT_EQ(count.load(), 100);
}

TEST(ThreadPool, RunWaits) {
  ThreadPool pool(2);
  int x = 0;
  pool.Run([&] { x = 7; });
  EXPECT_EQ(x, 7);
}

}  // namespace
}  // namespace gcomp::server

#include "base/reused_per_thread.h"

#include <set>
#include <thread>
#include <vector>

#include "absl/synchronization/barrier.h"
#include "gtest/gtest.h"

namespace gcomp {
namespace {

// Each test uses its own T, so the free lists do not meet.
struct First {
  int value = 0;
};
struct Concurrent {
  int value = 0;
};
struct Bounded {
  int value = 0;
};

TEST(ReusedPerThread, ALaterThreadTakesOverAnExitedThreadsObject) {
  First* first = nullptr;
  std::thread([&] {
    first = &ReusedPerThread<First>::Get();
    first->value = 42;
    EXPECT_EQ(&ReusedPerThread<First>::Get(), first);  // the same object for the thread's life
  }).join();
  EXPECT_EQ(ReusedPerThread<First>::Waiting(), 1u);
  First* second = nullptr;
  int seen = 0;
  std::thread([&] {
    second = &ReusedPerThread<First>::Get();
    seen = second->value;
  }).join();
  EXPECT_EQ(second, first);
  EXPECT_EQ(seen, 42);  // handed on as the last thread left it
  EXPECT_EQ(ReusedPerThread<First>::Waiting(), 1u);
}

TEST(ReusedPerThread, ThreadsAliveAtOnceHaveTheirOwnObjects) {
  constexpr int kThreads = 4;
  absl::Barrier* all_have_one = new absl::Barrier(kThreads);
  std::vector<Concurrent*> seen(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      seen[i] = &ReusedPerThread<Concurrent>::Get();
      seen[i]->value = i;
      if (all_have_one->Block()) delete all_have_one;
      EXPECT_EQ(seen[i]->value, i);  // nobody else wrote to it
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(std::set<Concurrent*>(seen.begin(), seen.end()).size(), size_t{kThreads});
  EXPECT_EQ(ReusedPerThread<Concurrent>::Waiting(), size_t{kThreads});
}

TEST(ReusedPerThread, KeepsAtMostKKeepObjects) {
  constexpr int kThreads = 7;
  absl::Barrier* all_have_one = new absl::Barrier(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&] {
      ReusedPerThread<Bounded, 3>::Get().value = 1;
      if (all_have_one->Block()) delete all_have_one;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ((ReusedPerThread<Bounded, 3>::Waiting()), 3u);
}

}  // namespace
}  // namespace gcomp

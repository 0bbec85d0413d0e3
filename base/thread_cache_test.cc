#include "base/thread_cache.h"

#include <atomic>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace gcomp {
namespace {

TEST(ThreadCache, ClosuresThatWaitForEachOtherAllRun) {
  // Every closure waits until all have started: a queue behind a fixed pool would hang.
  ThreadCache cache;
  constexpr int kClosures = 12;
  absl::Mutex mu;
  int started = 0;
  absl::BlockingCounter done(kClosures);
  for (int i = 0; i < kClosures; ++i) {
    cache.Run([&] {
      absl::MutexLock lock(&mu);
      ++started;
      auto all = [&] { return started == kClosures; };
      mu.Await(absl::Condition(&all));
      done.DecrementCount();
    });
  }
  done.Wait();
  EXPECT_EQ(cache.threads(), kClosures);
}

TEST(ThreadCache, ASteadyWorkloadReusesItsThreads) {
  ThreadCache cache;
  std::atomic<int> runs{0};
  for (int round = 0; round < 50; ++round) {
    absl::BlockingCounter done(4);
    for (int i = 0; i < 4; ++i) {
      cache.Run([&] { runs++; }, [&] { done.DecrementCount(); });
    }
    done.Wait();
  }
  EXPECT_EQ(runs.load(), 200);
  // Completion is signalled once a thread is parked again, so every round after the first
  // finds its 4 threads waiting.
  EXPECT_EQ(cache.threads(), 4);
}

TEST(ThreadCache, DestructionWaitsForRunningClosures) {
  std::atomic<int> finished{0};
  {
    ThreadCache cache;
    for (int i = 0; i < 8; ++i) {
      cache.Run([&] {
        absl::SleepFor(absl::Milliseconds(20));
        finished++;
      });
    }
  }
  EXPECT_EQ(finished.load(), 8);
}

}  // namespace
}  // namespace gcomp

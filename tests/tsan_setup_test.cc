// Guards the ThreadSanitizer set-up (tools/build_tsan_absl.sh, docs/BUILDING.md) rather
// than gcomp code: threads calling absl::Now() at once meet on Abseil's time SpinLock, whose
// TSan annotations are split between inline code in the caller and SpinLock::SlowLock.
// With Debian's uninstrumented libabsl_time beside the instrumented libabsl_base, TSan
// aborted on its own CHECK within a second here (and, rarely, in service_test). In the
// g++ suite this is a plain, quick concurrency smoke test.
#include <atomic>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace gcomp {
namespace {

TEST(TsanSetup, ThreadsCallingNowAtOnceDoNotAbort) {
  constexpr int kThreads = 8;
  constexpr int kCalls = 200000;
  std::atomic<int> backwards{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&backwards] {
      absl::Time last = absl::InfinitePast();
      for (int k = 0; k < kCalls; ++k) {
        const absl::Time now = absl::Now();
        // absl::Now() may step back a little when the clock is adjusted, never by seconds.
        if (now < last - absl::Seconds(1)) backwards.fetch_add(1);
        last = now;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(backwards.load(), 0);
}

}  // namespace
}  // namespace gcomp

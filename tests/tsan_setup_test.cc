// Guards the ThreadSanitizer set-up (tools/build_tsan_absl.sh, docs/BUILDING.md) rather
// than gcomp code: threads meeting on one of Abseil's SpinLocks, whose TSan annotations are
// split between inline code in the caller and SpinLock::SlowLock. With an uninstrumented
// Debian library as the caller (libabsl_time for absl::Now(); libabsl_random_internal_pool_urbg,
// which gRPC's BackOff reaches when it seeds a BitGen) beside the instrumented libabsl_base,
// TSan aborted on its own CHECK within a second here, and now and then in service_test. In
// the g++ suite these are plain, quick concurrency smoke tests.
#include <atomic>
#include <thread>
#include <vector>

#include "absl/random/random.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace gcomp {
namespace {

// Runs `body` on `threads` threads at once and joins them.
template <typename Body>
void OnThreads(int threads, const Body& body) {
  std::vector<std::thread> running;
  for (int i = 0; i < threads; ++i) running.emplace_back(body);
  for (std::thread& t : running) t.join();
}

TEST(TsanSetup, ThreadsCallingNowAtOnceDoNotAbort) {
  constexpr int kThreads = 8;
  constexpr int kCalls = 200000;
  std::atomic<int> backwards{0};
  OnThreads(kThreads, [&backwards] {
    absl::Time last = absl::InfinitePast();
    for (int k = 0; k < kCalls; ++k) {
      const absl::Time now = absl::Now();
      // absl::Now() may step back a little when the clock is adjusted, never by seconds.
      if (now < last - absl::Seconds(1)) backwards.fetch_add(1);
      last = now;
    }
  });
  EXPECT_EQ(backwards.load(), 0);
}

TEST(TsanSetup, ThreadsSeedingRandomGeneratorsAtOnceDoNotAbort) {
  // More threads than Abseil's random pool has entries (8), so entries are shared.
  constexpr int kThreads = 24;
  constexpr int kGenerators = 20000;
  std::atomic<int> out_of_range{0};
  OnThreads(kThreads, [&out_of_range] {
    for (int k = 0; k < kGenerators; ++k) {
      absl::BitGen gen;
      const int v = absl::Uniform(gen, 0, 10);
      if (v < 0 || v >= 10) out_of_range.fetch_add(1);
    }
  });
  EXPECT_EQ(out_of_range.load(), 0);
}

}  // namespace
}  // namespace gcomp

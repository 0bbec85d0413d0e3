#include "worker/upload_gate.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace gcomp::worker {
namespace {

TEST(UploadGate, LetsLimitCallersInAtOnce) {
  UploadGate gate(2);
  UploadGate::Slot a = gate.Enter(0);
  UploadGate::Slot b = gate.Enter(1);
  absl::Notification entered;
  std::thread third([&] {
    UploadGate::Slot c = gate.Enter(2);
    entered.Notify();
  });
  EXPECT_FALSE(entered.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  a.Release();
  entered.WaitForNotification();
  third.join();
}

TEST(UploadGate, FirstAttemptsGoInChunkOrder) {
  UploadGate gate(4);  // slots to spare: only the order holds chunk 1 back
  absl::Notification entered;
  std::thread later([&] {
    UploadGate::Slot s = gate.Enter(1);
    entered.Notify();
  });
  EXPECT_FALSE(entered.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  UploadGate::Slot first = gate.Enter(0);
  entered.WaitForNotification();
  later.join();
}

TEST(UploadGate, RetryWaitsOnlyForASlot) {
  UploadGate gate(1);
  { UploadGate::Slot s = gate.Enter(0); }
  { UploadGate::Slot s = gate.Enter(1); }
  UploadGate::Slot retry = gate.Enter(0);  // chunk 0 again, after chunk 1 started
  absl::Notification entered;
  std::thread next([&] {
    UploadGate::Slot s = gate.Enter(2);
    entered.Notify();
  });
  EXPECT_FALSE(entered.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  retry.Release();
  retry.Release();  // idempotent: frees one slot, not two
  entered.WaitForNotification();
  next.join();
}

TEST(UploadGate, OpenReleasesEveryWaiter) {
  UploadGate gate(1);
  UploadGate::Slot held = gate.Enter(0);
  std::atomic<int> entered{0};
  std::vector<std::thread> waiters;
  for (uint32_t c = 2; c < 6; ++c) {  // chunk 1 never comes
    waiters.emplace_back([&gate, &entered, c] {
      UploadGate::Slot s = gate.Enter(c);
      ++entered;
    });
  }
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(entered.load(), 0);
  gate.Open();
  for (std::thread& t : waiters) t.join();
  EXPECT_EQ(entered.load(), 4);
}

TEST(UploadGate, ManyCallersNeverExceedTheLimit) {
  constexpr uint32_t kLimit = 2;
  UploadGate gate(kLimit);
  absl::Mutex mu;
  uint32_t inside = 0, most = 0;
  std::atomic<uint32_t> next{0};
  std::vector<std::thread> senders;
  for (int i = 0; i < 6; ++i) {
    senders.emplace_back([&] {
      for (uint32_t c = next++; c < 300; c = next++) {
        UploadGate::Slot s = gate.Enter(c);
        {
          absl::MutexLock lock(&mu);
          most = std::max(most, ++inside);
        }
        absl::MutexLock lock(&mu);
        --inside;
      }
    });
  }
  for (std::thread& t : senders) t.join();
  EXPECT_LE(most, kLimit);
  EXPECT_GE(most, 1u);
}

}  // namespace
}  // namespace gcomp::worker

#include "worker/bounded_queue.h"

#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace gcomp::worker {
namespace {

TEST(BoundedQueue, DeliversEveryItemOnceThenEndsAfterClose) {
  BoundedQueue<std::unique_ptr<int>> q(2);
  std::vector<int> seen(1000, 0);
  std::vector<std::thread> consumers;
  for (int i = 0; i < 3; ++i) {
    consumers.emplace_back([&] {
      while (std::optional<std::unique_ptr<int>> item = q.Pop()) ++seen[**item];
    });
  }
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(q.Push(std::make_unique<int>(i)));
  q.Close();
  for (std::thread& t : consumers) t.join();
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(seen[i], 1) << i;
  EXPECT_TRUE(q.status().ok());
}

TEST(BoundedQueue, PushWaitsForRoom) {
  BoundedQueue<int> q(1);
  ASSERT_TRUE(q.Push(1));
  absl::Notification pushed;
  std::thread producer([&] {
    EXPECT_TRUE(q.Push(2));
    pushed.Notify();
  });
  EXPECT_FALSE(pushed.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  EXPECT_EQ(q.Pop(), 1);
  pushed.WaitForNotification();
  producer.join();
  EXPECT_EQ(q.Pop(), 2);
}

TEST(BoundedQueue, FirstFailureWinsAndWakesEveryone) {
  BoundedQueue<int> q(1);
  ASSERT_TRUE(q.Push(7));
  std::thread blocked_producer([&] { EXPECT_FALSE(q.Push(8)); });
  absl::SleepFor(absl::Milliseconds(20));
  q.Fail(absl::UnavailableError("shard 1 down"));
  q.Fail(absl::InternalError("later"));
  blocked_producer.join();
  EXPECT_TRUE(q.failed());
  EXPECT_EQ(q.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(q.Pop(), std::nullopt);  // what was queued is dropped
  EXPECT_FALSE(q.Push(9));
}

TEST(BoundedQueue, PopWaitsUntilCloseOnAnEmptyQueue) {
  BoundedQueue<int> q(4);
  absl::Notification done;
  std::thread consumer([&] {
    EXPECT_EQ(q.Pop(), std::nullopt);
    done.Notify();
  });
  EXPECT_FALSE(done.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  q.Close();
  done.WaitForNotification();
  consumer.join();
}

}  // namespace
}  // namespace gcomp::worker

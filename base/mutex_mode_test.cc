#include "base/mutex_mode.h"

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace gcomp {
namespace {

// Two mutexes taken in both orders form a cycle in the lock-order history. With the check
// on (Debian's Abseil), the second order aborts the process; the death test shows the check
// is on here, so that the test after it shows the call turns it off.
void TakeInBothOrders() {
  absl::Mutex a, b;
  {
    absl::MutexLock la(&a);
    absl::MutexLock lb(&b);
  }
  {
    absl::MutexLock lb(&b);
    absl::MutexLock la(&a);
  }
}

TEST(DisableMutexDeadlockDetection, AnInvertedLockOrderNoLongerAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(TakeInBothOrders(), "deadlock");
  DisableMutexDeadlockDetection();
  TakeInBothOrders();  // returns
}

}  // namespace
}  // namespace gcomp

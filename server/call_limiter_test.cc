#include "server/call_limiter.h"

#include <optional>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gcomp::server {
namespace {

using ::testing::HasSubstr;

TEST(CallLimiter, BoundsCallsPerClient) {
  CallLimiter limiter(2);
  std::vector<CallLimiter::Slot> held;
  held.push_back(*limiter.Acquire("ipv4:1.2.3.4:5"));
  held.push_back(*limiter.Acquire("ipv4:1.2.3.4:5"));
  absl::StatusOr<CallLimiter::Slot> third = limiter.Acquire("ipv4:1.2.3.4:5");
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(third.status().message()),
              HasSubstr("ipv4:1.2.3.4:5 already has 2 calls in flight"));
  EXPECT_THAT(std::string(third.status().message()), HasSubstr("limits.max_calls_per_client = 2"));
  EXPECT_TRUE(limiter.Acquire("ipv4:1.2.3.4:6").ok());  // another client is not affected
  EXPECT_EQ(limiter.in_flight("ipv4:1.2.3.4:5"), 2u);
  held.pop_back();
  EXPECT_EQ(limiter.in_flight("ipv4:1.2.3.4:5"), 1u);
  EXPECT_TRUE(limiter.Acquire("ipv4:1.2.3.4:5").ok());
}

TEST(CallLimiter, IdleClientsAreForgotten) {
  CallLimiter limiter(1);
  for (int i = 0; i < 1000; ++i) {
    absl::StatusOr<CallLimiter::Slot> s = limiter.Acquire(absl::StrCat("peer", i));
    ASSERT_TRUE(s.ok());
  }
  EXPECT_EQ(limiter.clients(), 0u);
  std::optional<CallLimiter::Slot> moved;
  {
    CallLimiter::Slot s = *limiter.Acquire("a");
    moved.emplace(std::move(s));
  }
  EXPECT_EQ(limiter.in_flight("a"), 1u);  // the moved-from slot released nothing
  moved.reset();
  EXPECT_EQ(limiter.in_flight("a"), 0u);
}

}  // namespace
}  // namespace gcomp::server

#include "server/admission.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gcomp::server {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(Admission, MemoryIsReservedUpToTheBudget) {
  Admission a({.memory_budget_bytes = 1000});
  EXPECT_TRUE(a.ReserveMemory(600, "first").ok());
  absl::Status s = a.ReserveMemory(401, "declaring 'w'");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("limits.memory_budget_bytes = 1000"), HasSubstr("600 bytes in use"),
                    HasSubstr("declaring 'w' asks for 401")));
  EXPECT_EQ(a.usage().memory_bytes, 600u);  // the refused request left nothing
  EXPECT_EQ(a.usage().refused, 1u);
  EXPECT_TRUE(a.ReserveMemory(400, "exactly the rest").ok());
  a.ReleaseMemory(1000);
  EXPECT_EQ(a.usage().memory_bytes, 0u);
}

TEST(Admission, CheckingMemoryReservesNothing) {
  Admission a({.memory_budget_bytes = 1000});
  ASSERT_TRUE(a.ReserveMemory(600, "first").ok());
  EXPECT_TRUE(a.CheckMemory(400, "fits").ok());
  EXPECT_EQ(a.usage().memory_bytes, 600u);
  absl::Status s = a.CheckMemory(401, "declaring 'w'");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("600 bytes in use"), HasSubstr("declaring 'w' asks for 401")));
  EXPECT_EQ(a.usage().memory_bytes, 600u);
  EXPECT_EQ(a.usage().refused, 1u);
}

TEST(Admission, HugeRequestsDoNotOverflow) {
  Admission a({.memory_budget_bytes = 1000});
  ASSERT_TRUE(a.ReserveMemory(10, "x").ok());
  EXPECT_EQ(a.ReserveMemory(~uint64_t{0}, "huge").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(a.usage().memory_bytes, 10u);
}

TEST(Admission, PendingStepsAndBytesAreBounded) {
  Admission a({.memory_budget_bytes = 1 << 20, .max_pending_steps = 2, .max_pending_bytes = 100});
  EXPECT_TRUE(a.AddPending(true, 40, "c0").ok());
  EXPECT_TRUE(a.AddPending(false, 40, "c0 again").ok());
  absl::Status bytes = a.AddPending(true, 40, "c1");
  EXPECT_EQ(bytes.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(bytes.message()), HasSubstr("limits.max_pending_bytes = 100"));
  EXPECT_EQ(a.usage().pending_steps, 1u);
  EXPECT_EQ(a.usage().pending_bytes, 80u);
  EXPECT_TRUE(a.AddPending(true, 10, "c1").ok());
  absl::Status steps = a.AddPending(true, 1, "c2");
  EXPECT_EQ(steps.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(steps.message()), HasSubstr("limits.max_pending_steps = 2"));
  a.RemovePending(true, 80);
  a.RemovePending(true, 10);
  EXPECT_EQ(a.usage().pending_steps, 0u);
  EXPECT_EQ(a.usage().pending_bytes, 0u);
  EXPECT_TRUE(a.AddPending(true, 100, "c2").ok());
}

TEST(Admission, ZeroPendingBytesMeansOnlyTheBudget) {
  Admission a({.memory_budget_bytes = 1 << 20, .max_pending_steps = 10, .max_pending_bytes = 0});
  EXPECT_TRUE(a.AddPending(true, uint64_t{1} << 40, "big").ok());
}

}  // namespace
}  // namespace gcomp::server

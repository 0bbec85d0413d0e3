#include "base/logging.h"

#include "gtest/gtest.h"

namespace gcomp {
namespace {

TEST(InitLogging, RejectsUnknownLevelByName) {
  const absl::Status status = InitLogging("logging_test_bad", "verbose");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("verbose"), absl::string_view::npos);
}

TEST(InitLogging, AcceptsKnownLevelAndLogs) {
  ASSERT_TRUE(InitLogging("logging_test", "debug").ok());
  EXPECT_EQ(spdlog::default_logger()->level(), spdlog::level::debug);
  log::Info("value {} and {}", 1, "two");  // must compile and not throw
}

}  // namespace
}  // namespace gcomp

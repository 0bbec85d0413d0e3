#include "base/log_flags.h"

#include "absl/flags/flag.h"
#include "base/logging.h"
#include "gtest/gtest.h"
#include "spdlog/spdlog.h"

namespace gcomp {
namespace {

TEST(LogFlags, EmptyLevelTakesTheProgramsDefault) {
  absl::SetFlag(&FLAGS_log_level, "");
  absl::SetFlag(&FLAGS_log_format, "text");
  ASSERT_TRUE(InitLoggingFromFlags("log_flags_test", "warn").ok());
  EXPECT_EQ(spdlog::get_level(), spdlog::level::warn);
  ASSERT_TRUE(InitLoggingFromFlags("log_flags_test", "info").ok());
  EXPECT_EQ(spdlog::get_level(), spdlog::level::info);
}

TEST(LogFlags, AGivenLevelWins) {
  absl::SetFlag(&FLAGS_log_level, "error");
  absl::SetFlag(&FLAGS_log_format, "json");
  ASSERT_TRUE(InitLoggingFromFlags("log_flags_test", "info").ok());
  EXPECT_EQ(spdlog::get_level(), spdlog::level::err);
}

TEST(LogFlags, UnknownValuesAreInvalidArgument) {
  absl::SetFlag(&FLAGS_log_level, "loud");
  absl::SetFlag(&FLAGS_log_format, "text");
  EXPECT_EQ(InitLoggingFromFlags("log_flags_test", "info").code(),
            absl::StatusCode::kInvalidArgument);
  absl::SetFlag(&FLAGS_log_level, "");
  absl::SetFlag(&FLAGS_log_format, "xml");
  EXPECT_EQ(InitLoggingFromFlags("log_flags_test", "info").code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gcomp

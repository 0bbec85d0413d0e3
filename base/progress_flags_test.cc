#include "base/progress_flags.h"

#include "absl/flags/flag.h"
#include "gtest/gtest.h"

namespace gcomp {
namespace {

TEST(ProgressFlags, DefaultsToAuto) {
  absl::StatusOr<ProgressMode> mode = ProgressModeFromFlags();
  ASSERT_TRUE(mode.ok()) << mode.status();
  EXPECT_EQ(*mode, ProgressMode::kAuto);
}

TEST(ProgressFlags, ParsesTheFlag) {
  absl::SetFlag(&FLAGS_progress, "never");
  EXPECT_EQ(*ProgressModeFromFlags(), ProgressMode::kNever);
  absl::SetFlag(&FLAGS_progress, "always");
  EXPECT_EQ(*ProgressModeFromFlags(), ProgressMode::kAlways);
  absl::SetFlag(&FLAGS_progress, "sometimes");
  EXPECT_EQ(ProgressModeFromFlags().status().code(), absl::StatusCode::kInvalidArgument);
  absl::SetFlag(&FLAGS_progress, "auto");
}

}  // namespace
}  // namespace gcomp

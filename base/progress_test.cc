#include "base/progress.h"

#include <unistd.h>

#include <cstdio>
#include <string>

#include "gtest/gtest.h"

namespace gcomp {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1'800'000'000);

TEST(ParseProgressMode, AcceptsTheThreeModesAndNamesABadOne) {
  EXPECT_EQ(*ParseProgressMode("auto"), ProgressMode::kAuto);
  EXPECT_EQ(*ParseProgressMode("always"), ProgressMode::kAlways);
  EXPECT_EQ(*ParseProgressMode("never"), ProgressMode::kNever);
  const absl::StatusOr<ProgressMode> bad = ParseProgressMode("sometimes");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("sometimes"), absl::string_view::npos);
}

TEST(ProgressEnabled, AutoFollowsWhetherTheDescriptorIsATerminal) {
  FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  EXPECT_FALSE(ProgressEnabled(ProgressMode::kAuto, fileno(f)));  // a file is no terminal
  EXPECT_TRUE(ProgressEnabled(ProgressMode::kAlways, fileno(f)));
  EXPECT_FALSE(ProgressEnabled(ProgressMode::kNever, fileno(f)));
  std::fclose(f);
}

TEST(FormatEta, UsesTheTwoLargestUnitsRoundedUp) {
  EXPECT_EQ(FormatEta(absl::ZeroDuration()), "0s");
  EXPECT_EQ(FormatEta(absl::Milliseconds(100)), "1s");
  EXPECT_EQ(FormatEta(absl::Seconds(45)), "45s");
  EXPECT_EQ(FormatEta(absl::Seconds(59.5)), "1m00s");
  EXPECT_EQ(FormatEta(absl::Seconds(60)), "1m00s");
  EXPECT_EQ(FormatEta(absl::Seconds(155)), "2m35s");
  EXPECT_EQ(FormatEta(absl::Seconds(3600 + 120 + 5)), "1h02m");
  EXPECT_EQ(FormatEta(absl::Hours(76)), "3d04h");
  EXPECT_EQ(FormatEta(absl::InfiniteDuration()), "?");
  EXPECT_EQ(FormatEta(absl::Seconds(-1)), "?");
}

TEST(ProgressMeter, FormatsStepRateRatioAndEta) {
  ProgressMeter meter(10000, kStart);
  // 1234 steps in 21.76 s: 56.7 steps/s; 8766 left: 154.6 s, shown rounded up as 2m35s.
  std::optional<std::string> line = meter.Update(1234, 421, 100, kStart + absl::Seconds(21.76));
  ASSERT_TRUE(line.has_value());
  EXPECT_EQ(*line, "step 1234/10000  56.7 steps/s  ratio 4.21x  ETA 2m35s");
}

TEST(ProgressMeter, ShowsAtMostOneLinePerIntervalButAlwaysTheLast) {
  ProgressMeter meter(4, kStart);
  EXPECT_TRUE(meter.Update(1, 0, 0, kStart + absl::Milliseconds(100)).has_value());
  EXPECT_FALSE(meter.Update(2, 0, 0, kStart + absl::Milliseconds(300)).has_value());
  EXPECT_TRUE(meter.Update(3, 0, 0, kStart + absl::Milliseconds(600)).has_value());
  std::optional<std::string> last = meter.Update(4, 0, 0, kStart + absl::Milliseconds(700));
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->substr(0, 8), "step 4/4");
  EXPECT_NE(last->find("ETA 0s"), std::string::npos) << *last;
  EXPECT_EQ(last->find("ratio"), std::string::npos) << "no wire bytes, no ratio: " << *last;
}

TEST(ProgressMeter, SmoothsTheRateTowardsRecentIntervals) {
  ProgressOptions options;
  options.smoothing = 0.5;
  ProgressMeter meter(0, kStart, options);
  meter.Update(10, 0, 0, kStart + absl::Seconds(1));  // 10 steps/s
  EXPECT_DOUBLE_EQ(meter.steps_per_second(), 10);
  meter.Update(40, 0, 0, kStart + absl::Seconds(2));  // 30 steps/s in this interval
  EXPECT_DOUBLE_EQ(meter.steps_per_second(), 20);
  // Unknown total: no "/total", no ETA.
  EXPECT_EQ(meter.Line(), "step 40  20.0 steps/s");
}

TEST(ProgressMeter, TheRateStartsAfterTheFirstStep) {
  ProgressMeter meter(100, kStart);
  // Step 1 took 10 s of warm-up; steps 2..21 then took 1 s: 20 steps/s, not 21/11.
  std::optional<std::string> first = meter.Update(1, 0, 0, kStart + absl::Seconds(10));
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(*first, "step 1/100  - steps/s  ETA ?");
  meter.Update(21, 0, 0, kStart + absl::Seconds(11));
  EXPECT_DOUBLE_EQ(meter.steps_per_second(), 20);
  EXPECT_EQ(meter.Line(), "step 21/100  20.0 steps/s  ETA 4s");
}

TEST(ProgressMeter, BeforeAnyStepTheRateAndEtaAreUnknown) {
  ProgressMeter meter(100, kStart);
  std::optional<std::string> line = meter.Update(0, 0, 0, kStart + absl::Seconds(3));
  ASSERT_TRUE(line.has_value());
  EXPECT_EQ(*line, "step 0/100  - steps/s  ETA ?");
}

std::string ReadAll(FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string text;
  char buf[256];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
  return text;
}

TEST(ProgressPrinter, RewritesOneLineAndBlanksALongerPreviousOne) {
  FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    ProgressPrinter printer(f, true);
    printer.Show("step 9/10  long");
    printer.Show("step 10/10");
    printer.Finish();
  }
  EXPECT_EQ(ReadAll(f), "\rstep 9/10  long\rstep 10/10     \n");
  std::fclose(f);
}

TEST(ProgressPrinter, WritesNothingWhenDisabled) {
  FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    ProgressPrinter printer(f, false);
    printer.Show("step 1/2");
    printer.Finish("step 2/2");
  }
  EXPECT_EQ(ReadAll(f), "");
  std::fclose(f);
}

}  // namespace
}  // namespace gcomp

#include "base/usage_trend.h"

#include <vector>

#include "gtest/gtest.h"

namespace gcomp {
namespace {

ProcessUsage U(uint64_t rss, uint64_t fds = 10) { return ProcessUsage{rss, fds}; }

TEST(UsageTrend, JitterAroundAFlatLevelIsNotGrowth) {
  // Samples alternate between a trough and a peak 10% above it; the last sample is a peak
  // and the first a trough, so single samples read as +10%.
  std::vector<ProcessUsage> s;
  for (int i = 0; i < 400; ++i) s.push_back(U(i % 2 == 0 ? 1000 : 1100));
  s.push_back(U(1100));
  const UsageTrend t = MeasureUsageTrend(s);
  EXPECT_EQ(t.window, 40u);
  EXPECT_NEAR(t.rss_growth_pct, 0.0, 1e-9);
  EXPECT_NEAR(t.rss_peak_growth_pct, 0.0, 1e-9);
  EXPECT_EQ(t.first.rss_bytes, 1000u);
  EXPECT_EQ(t.last.rss_bytes, 1100u);
}

TEST(UsageTrend, ALeakIsGrowth) {
  // +1 byte per sample over 1,000 samples from 1,000: the level moves by about 900.
  std::vector<ProcessUsage> s;
  for (int i = 0; i < 1000; ++i) s.push_back(U(1000 + i, 10 + i / 100));
  const UsageTrend t = MeasureUsageTrend(s);
  EXPECT_EQ(t.window, 100u);
  EXPECT_EQ(t.first_median.rss_bytes, 1050u);
  EXPECT_EQ(t.last_median.rss_bytes, 1950u);
  EXPECT_NEAR(t.rss_growth_pct, 900.0 * 100 / 1050, 1e-9);
  EXPECT_NEAR(t.fd_growth_pct, 90.0, 1e-9);  // 10 -> 19 open files
  EXPECT_GT(t.rss_peak_growth_pct, 80.0);
}

TEST(UsageTrend, ShortRunsUseHalves) {
  const std::vector<ProcessUsage> s = {U(100), U(100), U(200), U(200)};
  const UsageTrend t = MeasureUsageTrend(s);
  EXPECT_EQ(t.window, 2u);
  EXPECT_NEAR(t.rss_growth_pct, 100.0, 1e-9);
}

TEST(UsageTrend, FewerThanTwoSamplesGiveNoTrend) {
  const std::vector<ProcessUsage> s = {U(100)};
  const UsageTrend t = MeasureUsageTrend(s);
  EXPECT_EQ(t.samples, 1u);
  EXPECT_EQ(t.window, 0u);
  EXPECT_EQ(t.rss_growth_pct, 0.0);
}

}  // namespace
}  // namespace gcomp

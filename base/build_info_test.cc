#include "base/build_info.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "base/build_info_metric.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace gcomp {
namespace {

std::string ReleaseFromVersionFile() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  EXPECT_NE(srcdir, nullptr);
  std::ifstream in(std::string(srcdir ? srcdir : ".") + "/gcomp_ps/VERSION");
  std::string line;
  std::getline(in, line);
  return line;
}

// 12 hex digits, "-dirty" after them or not; or "unknown". (No std::regex: g++ warns inside
// it under the sanitizer build's -O1, and warnings are errors.)
bool IsRevision(absl::string_view r) {
  if (r == "unknown") return true;
  if (absl::EndsWith(r, "-dirty")) r.remove_suffix(6);
  return r.size() == 12 && r.find_first_not_of("0123456789abcdef") == absl::string_view::npos;
}

TEST(BuildInfo, RevisionFormatIsChecked) {
  EXPECT_TRUE(IsRevision("5c50a0bee070"));
  EXPECT_TRUE(IsRevision("5c50a0bee070-dirty"));
  EXPECT_TRUE(IsRevision("unknown"));
  EXPECT_FALSE(IsRevision("5c50a0bee07"));
  EXPECT_FALSE(IsRevision("5C50A0BEE070"));
  EXPECT_FALSE(IsRevision(""));
}

TEST(BuildInfo, VersionIsTheReleaseFileAndRevisionIsAGitRevisionOrUnknown) {
  const BuildInfo info = GetBuildInfo();
  EXPECT_EQ(std::string(info.version), ReleaseFromVersionFile());
  EXPECT_TRUE(IsRevision(info.revision)) << info.revision;
}

TEST(BuildInfo, VersionLineNamesProgramReleaseAndRevision) {
  const BuildInfo info = GetBuildInfo();
  EXPECT_EQ(VersionLine("gcomp_server"), "gcomp_server " + std::string(info.version) +
                                             " (revision " + std::string(info.revision) + ")");
}

TEST(BuildInfo, MetricIsOneWithBothLabels) {
  prometheus::Registry registry;
  RegisterBuildInfo(registry);
  const std::string text = prometheus::TextSerializer().Serialize(registry.Collect());
  const BuildInfo info = GetBuildInfo();
  EXPECT_THAT(text, ::testing::HasSubstr("gcomp_build_info{revision=\"" + std::string(info.revision) +
                                         "\",version=\"" + std::string(info.version) + "\"} 1"));
}

}  // namespace
}  // namespace gcomp

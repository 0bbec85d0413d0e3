#include "base/build_info.h"

#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

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

TEST(BuildInfo, VersionIsTheReleaseFileAndRevisionIsAGitRevisionOrUnknown) {
  const BuildInfo info = GetBuildInfo();
  EXPECT_EQ(std::string(info.version), ReleaseFromVersionFile());
  EXPECT_TRUE(std::regex_match(std::string(info.revision),
                               std::regex("[0-9a-f]{12}(-dirty)?|unknown")))
      << info.revision;
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

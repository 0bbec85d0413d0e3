#include "cluster/config_flags.h"

#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gcomp::cluster {
namespace {

using ::testing::HasSubstr;

TEST(ConfigFlags, LoadsTheFileWithTheOverrides) {
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/cluster.yaml");
  ASSERT_TRUE(WriteFileAtomically(path, "job: t\nworkers: 2\nshards: [\"127.0.0.1:5001\"]\n").ok());
  absl::SetFlag(&FLAGS_config, path);
  absl::SetFlag(&FLAGS_set, std::vector<std::string>{"workers=4"});
  absl::StatusOr<proto::ClusterConfig> c = LoadClusterConfigFromFlags();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->job(), "t");
  EXPECT_EQ(c->workers(), 4u);
  absl::SetFlag(&FLAGS_set, std::vector<std::string>{});
}

TEST(ConfigFlags, AMissingFileIsNotFoundNamingIt) {
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/absent.yaml");
  absl::SetFlag(&FLAGS_config, path);
  absl::StatusOr<proto::ClusterConfig> c = LoadClusterConfigFromFlags();
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(c.status().message(), HasSubstr(path));
}

}  // namespace
}  // namespace gcomp::cluster

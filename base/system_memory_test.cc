#include "base/system_memory.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>

#include "gtest/gtest.h"

namespace gcomp {
namespace {

TEST(SystemMemory, ParsesCgroupLimits) {
  EXPECT_EQ(ParseCgroupLimit("1073741824\n"), 1073741824u);
  EXPECT_EQ(ParseCgroupLimit("max\n"), std::nullopt);
  EXPECT_EQ(ParseCgroupLimit(""), std::nullopt);
  EXPECT_EQ(ParseCgroupLimit("12abc"), std::nullopt);
  EXPECT_EQ(ParseCgroupLimit("0"), std::nullopt);
}

TEST(SystemMemory, ReadsV2AndV1Files) {
  const std::string root = std::string(getenv("TEST_TMPDIR")) + "/cg";
  mkdir(root.c_str(), 0755);
  EXPECT_EQ(CgroupMemoryLimitBytes(root), std::nullopt);  // no files: no limit
  {
    std::ofstream(root + "/memory.max") << "max\n";
  }
  EXPECT_EQ(CgroupMemoryLimitBytes(root), std::nullopt);
  {
    std::ofstream(root + "/memory.max") << "536870912\n";
  }
  EXPECT_EQ(CgroupMemoryLimitBytes(root), 536870912u);

  const std::string v1 = root + "/v1";
  mkdir(v1.c_str(), 0755);
  mkdir((v1 + "/memory").c_str(), 0755);
  {
    std::ofstream(v1 + "/memory/memory.limit_in_bytes") << "9223372036854771712\n";
  }
  EXPECT_EQ(CgroupMemoryLimitBytes(v1), std::nullopt);  // v1's "unlimited"
  {
    std::ofstream(v1 + "/memory/memory.limit_in_bytes") << "268435456\n";
  }
  EXPECT_EQ(CgroupMemoryLimitBytes(v1), 268435456u);
}

TEST(SystemMemory, AvailableIsPositiveAndAtMostPhysical) {
  EXPECT_GT(PhysicalMemoryBytes(), 0u);
  EXPECT_GT(AvailableMemoryBytes(), 0u);
  EXPECT_LE(AvailableMemoryBytes(), PhysicalMemoryBytes());
}

}  // namespace
}  // namespace gcomp

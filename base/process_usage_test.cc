#include "base/process_usage.h"

#include <fcntl.h>
#include <unistd.h>

#include <vector>

#include "gtest/gtest.h"

namespace gcomp {
namespace {

TEST(ProcessUsage, SeesOwnMemoryAndFiles) {
  absl::StatusOr<ProcessUsage> before = ReadProcessUsage(getpid());
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_GT(before->rss_bytes, 0u);
  EXPECT_GE(before->open_fds, 3u);  // stdin, stdout, stderr at least

  std::vector<char> touched(64 << 20);
  for (size_t i = 0; i < touched.size(); i += 4096) touched[i] = 1;
  const int fd = open("/dev/null", O_RDONLY);
  ASSERT_GE(fd, 0);
  absl::StatusOr<ProcessUsage> after = ReadProcessUsage(getpid());
  ASSERT_TRUE(after.ok());
  EXPECT_GE(after->rss_bytes, before->rss_bytes + (48u << 20));
  EXPECT_EQ(after->open_fds, before->open_fds + 1);
  close(fd);
}

TEST(ProcessUsage, GoneProcessIsNotFound) {
  EXPECT_EQ(ReadProcessUsage(999999999).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace gcomp

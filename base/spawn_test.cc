#include "base/spawn.h"

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace gcomp {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(Spawn, ChildWritesItsOutputToTheFilesAndExitsWithItsStatus) {
  const std::string dir = getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp";
  const std::string out = dir + "/spawn.out", err = dir + "/spawn.err";
  const pid_t pid = Spawn({"/bin/sh", "-c", "echo to-out; echo to-err >&2; exit 3"}, out, err);
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 3);
  EXPECT_EQ(Slurp(out), "to-out\n");
  EXPECT_EQ(Slurp(err), "to-err\n");
}

TEST(Spawn, AMissingProgramExitsWith127) {
  const std::string dir = getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp";
  const pid_t pid = Spawn({"/nonexistent/program"}, dir + "/m.out", dir + "/m.err");
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 127);
}

}  // namespace
}  // namespace gcomp

#include "base/files.h"

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace gcomp {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

TEST(Files, WriteThenReadRoundTripsAndReplaces) {
  const std::string path = TempPath("files_test_roundtrip");
  ASSERT_TRUE(WriteFileAtomically(path, std::string("first\0bytes", 11)).ok());
  absl::StatusOr<std::string> got = ReadFile(path);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, std::string("first\0bytes", 11));
  ASSERT_TRUE(WriteFileAtomically(path, "second").ok());
  EXPECT_EQ(*ReadFile(path), "second");
}

TEST(Files, MissingFileIsNotFoundNamingIt) {
  absl::StatusOr<std::string> got = ReadFile(TempPath("no_such_file"));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(got.status().message().find("no_such_file"), absl::string_view::npos);
}

TEST(Files, UnwritableDirectoryFailsAndLeavesNothing) {
  const absl::Status s = WriteFileAtomically("/nonexistent_dir_gcomp/x", "data");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace gcomp

#include "base/mapped_file.h"

#include <cstdlib>
#include <string>
#include <utility>

#include "base/files.h"
#include "gtest/gtest.h"

namespace gcomp {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

TEST(MappedFile, HoldsTheFilesBytes) {
  const std::string path = TempPath("mapped_file_bytes");
  std::string data(3 << 20, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7 + (i >> 11));
  ASSERT_TRUE(WriteFileAtomically(path, data).ok());
  absl::StatusOr<MappedFile> file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(file->bytes() == data);
  // Moving keeps the mapping valid and leaves the source empty.
  MappedFile moved = *std::move(file);
  EXPECT_TRUE(moved.bytes() == data);
  EXPECT_TRUE(file->bytes().empty());  // NOLINT(bugprone-use-after-move): checked on purpose
}

TEST(MappedFile, EmptyAndUnmappableFilesAreRead) {
  const std::string path = TempPath("mapped_file_empty");
  ASSERT_TRUE(WriteFileAtomically(path, "").ok());
  absl::StatusOr<MappedFile> empty = MappedFile::Open(path);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->bytes().empty());
  // /proc files report size 0 and cannot be mapped.
  absl::StatusOr<MappedFile> proc = MappedFile::Open("/proc/self/status");
  ASSERT_TRUE(proc.ok()) << proc.status();
  EXPECT_NE(proc->bytes().find("VmRSS"), absl::string_view::npos);
}

TEST(MappedFile, MissingFileIsNotFoundNamingIt) {
  absl::StatusOr<MappedFile> file = MappedFile::Open(TempPath("mapped_file_missing"));
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(file.status().message().find("mapped_file_missing"), absl::string_view::npos);
}

}  // namespace
}  // namespace gcomp

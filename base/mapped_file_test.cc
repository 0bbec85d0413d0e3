#include "base/mapped_file.h"

#include <cstdlib>
#include <cstring>
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

// This process's resident memory backed by files (RssFile, and RssShmem for a tmpfs
// TEST_TMPDIR) in /proc/self/status, in KiB; -1 where the kernel does not say.
long ResidentFileKiB() {
  absl::StatusOr<std::string> status = ReadFile("/proc/self/status");
  if (!status.ok()) return -1;
  long total = 0;
  for (const char* field : {"RssFile:", "RssShmem:"}) {
    const size_t at = status->find(field);
    if (at == std::string::npos) return -1;
    total += std::strtol(status->c_str() + at + std::strlen(field), nullptr, 10);
  }
  return total;
}

// Read a window at a time: Prefetch maps a range in, Release takes it out of this process's
// resident memory, and the bytes stay the file's throughout.
TEST(MappedFile, PrefetchAndReleaseKeepTheBytesAndBoundResidentMemory) {
  const std::string path = TempPath("mapped_file_window");
  std::string data((16 << 20) + 123, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 13 + (i >> 12));
  ASSERT_TRUE(WriteFileAtomically(path, data).ok());
  MappedFileOptions options;
  options.populate = false;
  absl::StatusOr<MappedFile> file = MappedFile::Open(path, options);
  ASSERT_TRUE(file.ok()) << file.status();
  if (ResidentFileKiB() < 0) GTEST_SKIP() << "no RssFile in /proc/self/status";
  const long kib = static_cast<long>(data.size() >> 10);
  const long before = ResidentFileKiB();
  file->Prefetch(0, data.size());
  long mapped = ResidentFileKiB();
  if (mapped - before < kib / 2) {
    // A kernel without MADV_POPULATE_READ only reads ahead; map the pages by reading them.
    EXPECT_TRUE(file->bytes() == data);
    mapped = ResidentFileKiB();
  }
  ASSERT_GE(mapped - before, kib * 3 / 4) << "the pages were never mapped: nothing to release";
  // A window in the middle, then everything; ranges past the end are clipped.
  file->Release(data.size() / 4, data.size() / 2);
  const long half = ResidentFileKiB();
  EXPECT_LE(half, mapped - kib / 2 + kib / 8) << "Release of the middle half left it resident";
  file->Release(0, data.size() * 2);
  EXPECT_LE(ResidentFileKiB(), before + kib / 8) << "Release of the whole file left it resident";
  file->Prefetch(data.size() - 10, 1 << 20);
  file->Prefetch(data.size() + 10, 1 << 20);
  file->Release(data.size() + 10, 1 << 20);
  EXPECT_TRUE(file->bytes() == data) << "released pages must read back as the file's bytes";
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
  // The hints do nothing to bytes that were read into memory.
  const std::string copy(proc->bytes());
  proc->Prefetch(0, copy.size());
  proc->Release(0, copy.size());
  EXPECT_EQ(proc->bytes(), copy);
}

// A device that never ends (gcomp inspect /dev/zero read until memory ran out) stops at the
// limit; the default limit is kMaxUnsizedReadBytes.
TEST(MappedFile, AnEndlessDeviceIsReadNoFurtherThanTheLimit) {
  EXPECT_EQ(MappedFileOptions().max_unmapped_bytes, kMaxUnsizedReadBytes);
  MappedFileOptions options;
  options.max_unmapped_bytes = 1 << 20;
  absl::StatusOr<MappedFile> zero = MappedFile::Open("/dev/zero", options);
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kFailedPrecondition) << zero.status();
  EXPECT_NE(zero.status().message().find("larger than 1048576 bytes"), absl::string_view::npos)
      << zero.status();
}

TEST(MappedFile, MissingFileIsNotFoundNamingIt) {
  absl::StatusOr<MappedFile> file = MappedFile::Open(TempPath("mapped_file_missing"));
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(file.status().message().find("mapped_file_missing"), absl::string_view::npos);
}

}  // namespace
}  // namespace gcomp

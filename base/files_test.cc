#include "base/files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
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

// fsync cannot be watched from here (only a machine crash shows it): the durable write must
// keep every other promise of the plain one.
TEST(Files, DurableWriteKeepsTheSameContract) {
  AtomicWriteOptions durable;
  durable.fsync = true;
  const std::string path = TempPath("files_test_durable");
  ASSERT_TRUE(WriteFileAtomically(path, "first", durable).ok());
  EXPECT_EQ(*ReadFile(path), "first");
  const absl::string_view parts[] = {"sec", "ond"};
  ASSERT_TRUE(WriteFileAtomically(path, parts, durable).ok());
  EXPECT_EQ(*ReadFile(path), "second");
  EXPECT_EQ(ReadFile(absl::StrCat(path, ".tmp", getpid())).status().code(),
            absl::StatusCode::kNotFound);
  absl::StatusOr<AtomicFileWriter> writer = AtomicFileWriter::Create(path, durable);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE(writer->Append("xhird").ok());
  ASSERT_TRUE(writer->WriteAt(0, "t").ok());
  ASSERT_TRUE(writer->Commit().ok());
  EXPECT_EQ(*ReadFile(path), "third");
  EXPECT_EQ(WriteFileAtomically("/nonexistent_dir_gcomp/x", "data", durable).code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(Files, MissingFileIsNotFoundNamingIt) {
  absl::StatusOr<std::string> got = ReadFile(TempPath("no_such_file"));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(got.status().message().find("no_such_file"), absl::string_view::npos);
}

TEST(Files, PiecesAreWrittenInOrder) {
  const std::string path = TempPath("files_test_pieces");
  const absl::string_view parts[] = {"head", "", absl::string_view("\0mid", 4), "tail"};
  ASSERT_TRUE(WriteFileAtomically(path, parts).ok());
  EXPECT_EQ(*ReadFile(path), std::string("head\0midtail", 12));
}

TEST(Files, WriterDroppedWithoutCommitLeavesTheOldFile) {
  const std::string path = TempPath("files_test_abandoned");
  ASSERT_TRUE(WriteFileAtomically(path, "old").ok());
  {
    absl::StatusOr<AtomicFileWriter> writer = AtomicFileWriter::Create(path);
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE(writer->Append("new, but never committed").ok());
  }
  EXPECT_EQ(*ReadFile(path), "old");
  EXPECT_EQ(ReadFile(absl::StrCat(path, ".tmp", getpid())).status().code(),
            absl::StatusCode::kNotFound);
  absl::StatusOr<AtomicFileWriter> writer = AtomicFileWriter::Create(path);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE(writer->Append("new").ok());
  ASSERT_TRUE(writer->Commit().ok());
  EXPECT_EQ(*ReadFile(path), "new");
  EXPECT_EQ(writer->Append("late").code(), absl::StatusCode::kFailedPrecondition);
}

TEST(Files, WriterOverwritesWhatItAppended) {
  const std::string path = TempPath("files_test_write_at");
  absl::StatusOr<AtomicFileWriter> writer = AtomicFileWriter::Create(path);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE(writer->Append("head:????;").ok());
  ASSERT_TRUE(writer->Append("body").ok());
  ASSERT_TRUE(writer->WriteAt(5, "1234").ok());
  // Past the end: refused, naming the sizes, and the file is still usable.
  absl::Status past = writer->WriteAt(12, "xyz");
  EXPECT_EQ(past.code(), absl::StatusCode::kOutOfRange) << past;
  EXPECT_NE(past.message().find("it holds 14"), absl::string_view::npos) << past;
  EXPECT_EQ(writer->WriteAt(15, "").code(), absl::StatusCode::kOutOfRange);
  ASSERT_TRUE(writer->Append("!").ok());
  ASSERT_TRUE(writer->Commit().ok());
  EXPECT_EQ(*ReadFile(path), "head:1234;body!");
  EXPECT_EQ(writer->WriteAt(0, "x").code(), absl::StatusCode::kFailedPrecondition);
}

TEST(Files, ReadsLargeFilesWhole) {
  const std::string path = TempPath("files_test_large");
  std::string data(5 << 20, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131 + (i >> 13));
  ASSERT_TRUE(WriteFileAtomically(path, data).ok());
  absl::StatusOr<std::string> got = ReadFile(path);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->size(), data.size());
  EXPECT_TRUE(*got == data);
}

TEST(Files, FilesOfUnknownSizeAreReadWhole) {
  // /proc files report size 0; the read must not stop there.
  absl::StatusOr<std::string> got = ReadFile("/proc/self/status");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_NE(got->find("VmRSS"), std::string::npos);
}

TEST(Files, AReadWithALimitRefusesMoreNamingIt) {
  const std::string path = TempPath("files_test_limit");
  ASSERT_TRUE(WriteFileAtomically(path, std::string(100, 'x')).ok());
  EXPECT_EQ(ReadFile(path, 100)->size(), 100u);
  absl::StatusOr<std::string> got = ReadFile(path, 99);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(got.status().message().find("larger than 99 bytes"), absl::string_view::npos)
      << got.status();
  // A device that never ends (a config or manifest path pointed at it) stops at the limit.
  got = ReadFile("/dev/zero", 1 << 20);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition) << got.status();
  EXPECT_NE(got.status().message().find("/dev/zero"), absl::string_view::npos);
}

TEST(Files, DirectoryIsDataLossNamingIt) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = dir != nullptr ? dir : "/tmp";
  absl::StatusOr<std::string> got = ReadFile(path);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(got.status().message().find(path), absl::string_view::npos);
}

TEST(Files, UnwritableDirectoryFailsAndLeavesNothing) {
  const absl::Status s = WriteFileAtomically("/nonexistent_dir_gcomp/x", "data");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
}

TEST(Files, ANonRegularTargetIsNotReplaced) {
  // A fifo stands for the devices and pipes a rename would replace with a plain file.
  const std::string fifo = TempPath("fifo_target");
  std::remove(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const absl::Status s = WriteFileAtomically(fifo, "data");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("not a regular file"), absl::string_view::npos) << s;
  struct stat st;
  ASSERT_EQ(lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  std::remove(fifo.c_str());
}

}  // namespace
}  // namespace gcomp

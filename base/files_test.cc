#include "base/files.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

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
  EXPECT_NE(s.message().find("/nonexistent_dir_gcomp/x"), absl::string_view::npos) << s;
}

// A reader never sees a mix of the old and the new content, nor an empty file, however
// its reads fall against the renames.
TEST(Files, ReadersSeeTheOldOrTheNewFileWhole) {
  const std::string path = TempPath("files_test_readers");
  const std::string a(64 << 10, 'a'), b(96 << 10, 'b');
  for (const bool durable : {false, true}) {
    AtomicWriteOptions options;
    options.fsync = durable;
    ASSERT_TRUE(WriteFileAtomically(path, a, options).ok());
    std::atomic<bool> done{false};
    std::atomic<int> torn{0}, reads{0};
    std::thread reader([&] {
      while (!done) {
        absl::StatusOr<std::string> got = ReadFile(path);
        if (!got.ok() || (*got != a && *got != b)) ++torn;
        ++reads;
      }
    });
    for (int i = 0; i < (durable ? 20 : 200); ++i) {
      ASSERT_TRUE(WriteFileAtomically(path, i % 2 ? a : b, options).ok());
    }
    done = true;
    reader.join();
    EXPECT_EQ(torn.load(), 0) << "of " << reads.load() << " reads";
  }
}

// A write that fails on the way (here the file size limit, which binds root too) removes
// its temporary file, leaves the target as it was and names the file it could not write.
TEST(Files, AFailedWriteKeepsTheOldFileAndCleansUp) {
  const std::string path = TempPath("files_test_failed");
  ASSERT_TRUE(WriteFileAtomically(path, "old").ok());
  struct rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  const sighandler_t old_handler = signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of the signal
  struct rlimit small = saved;
  small.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  AtomicWriteOptions durable;
  durable.fsync = true;
  const absl::Status plain = WriteFileAtomically(path, std::string(8192, 'x'));
  const absl::Status synced = WriteFileAtomically(path, std::string(8192, 'x'), durable);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &saved), 0);
  signal(SIGXFSZ, old_handler);
  for (const absl::Status& s : {plain, synced}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_NE(s.message().find(path), absl::string_view::npos) << s;
  }
  EXPECT_EQ(*ReadFile(path), "old");
  EXPECT_EQ(ReadFile(absl::StrCat(path, ".tmp", getpid())).status().code(),
            absl::StatusCode::kNotFound);
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

#include "cluster/job_token.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gcomp::cluster {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

std::string WriteToken(const std::string& name, const std::string& content) {
  const std::string path = TempPath(name);
  EXPECT_TRUE(WriteFileAtomically(path, content).ok());
  return path;
}

TEST(ConstantTimeEquals, ComparesContentsAndLengths) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_FALSE(ConstantTimeEquals("abd", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("xbc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("ab", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abcd", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", ""));
  EXPECT_FALSE(ConstantTimeEquals(absl::string_view("ab\0", 3), "ab"));
}

TEST(JobToken, ReadsTheFileTrimmedAndMakesTheHeader) {
  auto token = JobToken::Load(WriteToken("t1", "  s3cret-TOKEN_1\n\n"));
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ((*token)->Header(), "Bearer s3cret-TOKEN_1");
}

TEST(JobToken, MissingFileIsNotFoundNamingFieldAndPath) {
  const std::string path = TempPath("no-such-token");
  auto token = JobToken::Load(path);
  EXPECT_EQ(token.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(token.status().message()), HasSubstr("security.token_file"));
  EXPECT_THAT(std::string(token.status().message()), HasSubstr(path));
}

TEST(JobToken, EmptyOrWhitespaceFileIsFailedPrecondition) {
  for (const char* content : {"", " \n\t\n"}) {
    auto token = JobToken::Load(WriteToken("empty", content));
    EXPECT_EQ(token.status().code(), absl::StatusCode::kFailedPrecondition) << token.status();
    EXPECT_THAT(std::string(token.status().message()), HasSubstr("empty"));
  }
}

TEST(JobToken, CharactersAHeaderCannotCarryAreRefusedWithoutEchoingThem) {
  for (const char* content : {"two words", "tab\there", "caf\xc3\xa9", "nul\x01x"}) {
    auto token = JobToken::Load(WriteToken("bad", content));
    EXPECT_EQ(token.status().code(), absl::StatusCode::kFailedPrecondition) << content;
    EXPECT_THAT(std::string(token.status().message()), Not(HasSubstr(content)));
  }
}

// A rotation: shards accept the old and the new token while workers move from one to the
// other; clients send the first line.
TEST(JobToken, EveryLineIsAcceptedAndTheFirstIsSent) {
  const std::string path = WriteToken("rotate", "new-token\n\n  old-token  \n");
  auto token = JobToken::Load(path, absl::Milliseconds(10));
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ((*token)->Header(), "Bearer new-token");
  EXPECT_TRUE((*token)->Check({"Bearer new-token"}).ok());
  EXPECT_TRUE((*token)->Check({"Bearer old-token"}).ok());
  EXPECT_EQ((*token)->Check({"Bearer other"}).code(), absl::StatusCode::kPermissionDenied);
  // The rotation's last step: the old line goes, and with it the old token's access.
  ASSERT_TRUE(WriteFileAtomically(path, "new-token\n").ok());
  absl::SleepFor(absl::Milliseconds(30));
  EXPECT_EQ((*token)->Check({"Bearer old-token"}).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE((*token)->Check({"Bearer new-token"}).ok());
}

TEST(JobToken, TooManyTokensOrABadLineIsRefusedNamingTheLine) {
  auto many = JobToken::Load(WriteToken("many", "a\nb\nc\nd\ne\n"));
  EXPECT_EQ(many.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(many.status().message()), HasSubstr("at most 4"));
  auto bad = JobToken::Load(WriteToken("badline", "good\nsecret word\n"));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("line 2"));
  EXPECT_THAT(std::string(bad.status().message()), Not(HasSubstr("secret")));
}

TEST(JobToken, DirectoryIsNotFound) {
  auto token = JobToken::Load(TempPath(""));
  EXPECT_EQ(token.status().code(), absl::StatusCode::kNotFound) << token.status();
}

TEST(JobToken, CheckGivesUnauthenticatedForNoTokenAndPermissionDeniedForAWrongOne) {
  auto token = JobToken::Load(WriteToken("t2", "right"));
  ASSERT_TRUE(token.ok());
  JobToken& t = **token;
  EXPECT_TRUE(t.Check({"Bearer right"}).ok());
  EXPECT_TRUE(t.Check({"bearer right"}).ok());             // scheme is case-insensitive
  EXPECT_TRUE(t.Check({"Basic abc", "Bearer right"}).ok());  // one good value suffices
  EXPECT_EQ(t.Check({}).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(t.Check({"Basic right"}).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(t.Check({"right"}).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(t.Check({""}).code(), absl::StatusCode::kUnauthenticated);
  for (const char* wrong :
       {"Bearer wrong", "Bearer ", "Bearer righ", "Bearer rightt", "Bearer Right"}) {
    absl::Status s = t.Check({wrong});
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << wrong;
    EXPECT_THAT(std::string(s.message()), Not(HasSubstr("right")));
  }
}

TEST(JobToken, AChangedFileIsReReadAfterTheRecheckInterval) {
  const std::string path = WriteToken("t3", "first");
  auto token = JobToken::Load(path, absl::Milliseconds(50));
  ASSERT_TRUE(token.ok());
  ASSERT_TRUE(WriteFileAtomically(path, "second\n").ok());
  absl::SleepFor(absl::Milliseconds(120));
  EXPECT_EQ((*token)->Header(), "Bearer second");
  EXPECT_EQ((*token)->Check({"Bearer first"}).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE((*token)->Check({"Bearer second"}).ok());
}

TEST(JobToken, ABrokenReReadKeepsTheLastGoodToken) {
  const std::string path = WriteToken("t4", "kept");
  auto token = JobToken::Load(path, absl::Milliseconds(10));
  ASSERT_TRUE(token.ok());
  ASSERT_TRUE(WriteFileAtomically(path, "  \n").ok());
  absl::SleepFor(absl::Milliseconds(30));
  EXPECT_EQ((*token)->Header(), "Bearer kept");
  ASSERT_EQ(std::remove(path.c_str()), 0);
  absl::SleepFor(absl::Milliseconds(30));
  EXPECT_EQ((*token)->Header(), "Bearer kept");
  ASSERT_TRUE(WriteFileAtomically(path, "back").ok());
  absl::SleepFor(absl::Milliseconds(30));
  EXPECT_EQ((*token)->Header(), "Bearer back");
}

}  // namespace
}  // namespace gcomp::cluster
